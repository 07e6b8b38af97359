"""A repository: the git dir, its object directory and its refs."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Sequence

from . import durable
from .alternates import AlternatesChain, read_chain
from .errors import InvalidInputError, NotARepositoryError
from .objdir import ObjectDirectory, ObjectSnapshot
from .refs import RefStore

_CONFIG = b"""[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = true
"""


def find_git_dir(path: str | os.PathLike[str]) -> Path:
    """The git dir for ``path`` (a bare repository or a work tree with .git)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise NotARepositoryError("repository path does not exist", path=p) from None
    except NotADirectoryError:
        raise NotARepositoryError("repository path is not a directory (a component of it is a file)",
                                  path=p) from None
    except OSError as err:
        raise NotARepositoryError(f"repository path is not accessible: {err.strerror}", path=p) from err
    if not stat.S_ISDIR(st.st_mode):   # before the access check: a file is "not a directory", whatever its mode
        raise NotARepositoryError("repository path is not a directory", path=p)
    if not os.access(p, os.R_OK | os.X_OK):
        raise NotARepositoryError("repository path is not accessible (permission denied)", path=p)
    for candidate in (p, p / ".git"):
        if (candidate / "objects").is_dir() and (candidate / "refs").is_dir() and (candidate / "HEAD").is_file():
            if candidate.name == ".git" and candidate.is_symlink():
                refuse_escape(p.resolve(), candidate)   # a work tree's .git may not lead elsewhere
            git_dir = candidate.resolve()
            check_layout_contained(git_dir)
            return git_dir
    raise NotARepositoryError("not a git repository (no HEAD, objects/ and refs/)", path=p)


#: What a repository reads and writes outside refs/ (checked per ref by RefStore) and objects/ (checked here).
_TOP_LEVEL = ("HEAD", "objects", "refs", "packed-refs", "packyard")


def contained(git_dir: Path, path: Path) -> bool:
    """Whether ``path``, every symlink resolved, lies inside ``git_dir`` (itself a resolved path)."""
    real = Path(os.path.realpath(path))
    return real == git_dir or git_dir in real.parents


def refuse_escape(git_dir: Path, path: Path) -> None:
    """InvalidInputError unless ``path`` stays inside the repository once symlinks are resolved."""
    if not contained(git_dir, path):
        raise InvalidInputError("a symlink here leads outside the repository; refusing to read or write "
                                "through it", path=path)


def check_layout_contained(git_dir: Path) -> None:
    """Refuse a repository whose ``HEAD``, ``objects/`` (with its fan-out and pack dirs and pack files),
    ``refs``, ``packed-refs`` or ``packyard/`` is a symlink leading outside it: the store would read
    and write there. Symlinks that stay inside are allowed; entries under refs/ are checked per
    access by the RefStore. Costs one scandir of objects/ and objects/pack (symlinks: a realpath each).
    """
    for name in _TOP_LEVEL:
        p = git_dir / name
        if p.is_symlink():
            refuse_escape(git_dir, p)
    objects = git_dir / "objects"
    for directory in (objects, objects / "pack"):
        try:
            with os.scandir(directory) as it:
                links = [Path(e.path) for e in it if e.is_symlink()]
        except (FileNotFoundError, NotADirectoryError):
            continue
        for link in links:
            refuse_escape(git_dir, link)


class Repository:
    """A bare git repository on disk (local or NFS), with the object directories it borrows from
    (``objects/info/alternates``: :mod:`.alternates`) read once when it is opened."""

    def __init__(self, git_dir: Path, *, unsafe_trust_dir_mtime: bool = False,
                 alternate_roots: Sequence[Path] | None = None) -> None:
        """``alternate_roots``: every alternate must resolve inside one of these (the storage roots), or the
        repository is refused (:class:`~.alternates.AlternatesRefused`); None: not confined."""
        self.path = git_dir
        self.alternates: AlternatesChain = read_chain(git_dir / "objects", roots=alternate_roots)
        # unsafe_trust_dir_mtime: the race harness's negative control only (store/objdir.py).
        self.objects = ObjectDirectory(git_dir / "objects", unsafe_trust_dir_mtime=unsafe_trust_dir_mtime,
                                       alternates=self.alternates.paths)
        self.refs = RefStore(git_dir, objects=self.objects)

    def __repr__(self) -> str:
        return f"Repository({str(self.path)!r})"

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, unsafe_trust_dir_mtime: bool = False,
             alternate_roots: Sequence[Path] | None = None) -> "Repository":
        return cls(find_git_dir(path), unsafe_trust_dir_mtime=unsafe_trust_dir_mtime,
                   alternate_roots=alternate_roots)

    @classmethod
    def init(cls, path: str | os.PathLike[str], *, initial_branch: str = "main") -> "Repository":
        """Create a bare repository laid out as ``git init --bare`` does (idempotent)."""
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise InvalidInputError("cannot create a repository over a file", path=p)
        if p.exists() and any(p.iterdir()):
            try:
                return cls.open(p)
            except NotARepositoryError:
                raise InvalidInputError("directory exists, is not empty and is not a repository", path=p) from None
        for sub in ("objects/pack", "objects/info", "refs/heads", "refs/tags", "info"):
            (p / sub).mkdir(parents=True, exist_ok=True)
        durable.write_file_durably(p / "config", _CONFIG, mode=0o644)
        durable.write_file_durably(p / "description", b"Unnamed repository; edit this file to name it.\n",
                                   mode=0o644)
        durable.write_file_durably(p / "HEAD", f"ref: refs/heads/{initial_branch}\n".encode(), mode=0o644)
        durable.fsync_dir(p.parent if str(p.parent) else ".")
        return cls.open(p)

    def snapshot(self) -> ObjectSnapshot:
        return self.objects.snapshot()
