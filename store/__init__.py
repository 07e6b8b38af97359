"""packyard's object-store engine: plain Python over git's on-disk formats.

No Celery, Redis or SQL here. Format code works on bytes and files; the
:class:`~packyard.store.repo.Repository` front delegates to an
:class:`~packyard.store.objdir.ObjectDirectory` (loose objects + pack directory) and a
:class:`~packyard.store.refs.RefStore`.

The names below are loaded on first use (module ``__getattr__``): importing one submodule, say
``packyard.store.errors``, does not import the pack readers and their C extensions with it (a CLI
command that only needs an error class starts that much sooner; issue 39).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> the submodule defining it
_EXPORTS = {
    **dict.fromkeys(("CollisionError", "CorruptObjectError", "InvalidInputError", "LimitExceededError",
                     "LockLostError", "NotARepositoryError", "ObjectMissingError", "PackFormatError",
                     "RefUpdateError", "StoreError"), "errors"),
    **dict.fromkeys(("Location", "ObjectDirectory", "ObjectSnapshot"), "objdir"),
    "ObjectType": "objects",
    **dict.fromkeys(("RefStore", "RefUpdate"), "refs"),
    "Repository": "repo",
}

__all__ = [
    "CollisionError", "CorruptObjectError", "InvalidInputError", "LimitExceededError", "LockLostError",
    "Location", "NotARepositoryError", "ObjectDirectory", "ObjectMissingError", "ObjectSnapshot",
    "ObjectType", "PackFormatError", "RefStore", "RefUpdate", "RefUpdateError", "Repository", "StoreError",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
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
