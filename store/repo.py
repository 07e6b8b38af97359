"""A repository: the git dir, its object directory and its refs."""
from __future__ import annotations

import os
from pathlib import Path

from . import durable
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
        exists = p.exists() and os.access(p, os.R_OK | os.X_OK)
    except OSError as err:
        raise NotARepositoryError(f"repository path is not accessible: {err.strerror}", path=p) from err
    if not p.exists():
        raise NotARepositoryError("repository path does not exist", path=p)
    if not exists:
        raise NotARepositoryError("repository path is not accessible (permission denied)", path=p)
    if not p.is_dir():
        raise NotARepositoryError("repository path is not a directory", path=p)
    for candidate in (p, p / ".git"):
        if (candidate / "objects").is_dir() and (candidate / "refs").is_dir() and (candidate / "HEAD").is_file():
            return candidate.resolve()
    raise NotARepositoryError("not a git repository (no HEAD, objects/ and refs/)", path=p)


class Repository:
    """A bare git repository on disk (local or NFS)."""

    def __init__(self, git_dir: Path) -> None:
        self.path = git_dir
        self.objects = ObjectDirectory(git_dir / "objects")
        self.refs = RefStore(git_dir)

    def __repr__(self) -> str:
        return f"Repository({str(self.path)!r})"

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "Repository":
        return cls(find_git_dir(path))

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
