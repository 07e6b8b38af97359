"""packyard's object-store engine: plain Python over git's on-disk formats.

No Celery, Redis or SQL here. Format code works on bytes and files; the
:class:`~packyard.store.repo.Repository` front delegates to an
:class:`~packyard.store.objdir.ObjectDirectory` (loose objects + pack directory) and a
:class:`~packyard.store.refs.RefStore`.
"""
from .errors import (
    CollisionError,
    CorruptObjectError,
    InvalidInputError,
    LimitExceededError,
    LockLostError,
    NotARepositoryError,
    ObjectMissingError,
    PackFormatError,
    RefUpdateError,
    StoreError,
)
from .objdir import Location, ObjectDirectory, ObjectSnapshot
from .objects import ObjectType
from .refs import RefStore, RefUpdate
from .repo import Repository

__all__ = [
    "CollisionError", "CorruptObjectError", "InvalidInputError", "LimitExceededError", "LockLostError",
    "Location", "NotARepositoryError", "ObjectDirectory", "ObjectMissingError", "ObjectSnapshot",
    "ObjectType", "PackFormatError", "RefStore", "RefUpdate", "RefUpdateError", "Repository", "StoreError",
]
