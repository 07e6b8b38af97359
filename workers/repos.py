"""The one way a worker (queued or in-process) opens a repository: its alternates confined to the storage roots.

A repository inside a storage root (every queued job's: :mod:`.confine` checked it) may borrow only from
object directories inside a storage root too (``objects/info/alternates``: a fork's pool); one that leads
elsewhere is refused (:class:`~packyard.store.alternates.AlternatesRefused`, naming the file and the path) before
anything is read through it. A repository outside every root is reachable only from the CLI's in-process
commands, which run as the user on any path the user names; its alternates are the user's to choose.
"""
from __future__ import annotations

import os
from pathlib import Path

from packyard.store.repo import Repository, find_git_dir
from packyard.workers.settings import Settings, get_settings


def storage_roots(settings: Settings) -> tuple[Path, ...]:
    """The storage roots, resolved (what a repository's pool, a pool's source and members must lie inside)."""
    return tuple(Path(os.path.realpath(root)) for _name, root in settings.storage_roots)


def alternate_roots(git_dir: Path, settings: Settings) -> tuple[Path, ...] | None:
    """The roots a repository's alternates must lie inside: the storage roots for a repository in one,
    None (not confined) for one outside them all."""
    roots = storage_roots(settings)
    real = Path(os.path.realpath(git_dir))
    return roots if any(root in real.parents for root in roots) else None


def open_repository(path: str | os.PathLike[str], settings: Settings | None = None) -> Repository:
    """``Repository.open`` with the alternates rule above."""
    s = settings or get_settings()
    git_dir = find_git_dir(path)
    return Repository(git_dir, alternate_roots=alternate_roots(git_dir, s))


def open_beside(path: str | os.PathLike[str], anchor: str | os.PathLike[str],
                settings: Settings | None = None) -> Repository:
    """Open ``path``, a repository a job on ``anchor`` reads or writes beside it (a pool, a pool's source): when
    ``anchor`` lies in a storage root, ``path`` must lie in one too (InvalidInputError naming it), so no job on a
    repository in the roots reaches one outside them. Then :func:`open_repository`."""
    from packyard.store.errors import InvalidInputError

    s = settings or get_settings()
    roots = alternate_roots(Path(anchor), s)   # (realpath: also for a pool not made yet)
    if roots is not None:
        real = Path(os.path.realpath(path))
        if not any(root in real.parents for root in roots):
            raise InvalidInputError(f"a repository beside {anchor} must lie inside a storage root too "
                                    f"({', '.join(map(str, roots))})", path=os.fspath(path))
    return open_repository(path, s)
