"""Where a queued job may act: repositories inside the storage roots, input files inside the incoming dir.

A queued job's arguments come from whoever can publish to the broker (a frontend, Flower's
HTTP API, ``packyard submit``), so its paths are not trusted. Every queued task goes through
:func:`packyard.workers.tasks.boundary.prepared` (called by ``PackyardTask``), which uses this
module; the CLI's in-process commands do not: they run as the user, on any path the user names.

* **Repository** (``repo=``): an absolute path, or ``<storage>:<relative path>`` (Gitaly's
  storage addressing) for a storage named in PACKYARD_STORAGE_ROOTS. Its real path (every
  symlink resolved) must lie strictly inside one root; the job then works on that resolved
  absolute path, so lock names, log lines and job rows agree whatever spelling was sent.
* **Input file** (``pack=``, ``pack_path=``, ``objects_file=``): a path inside
  PACKYARD_INCOMING_DIR (a relative name is relative to it). Its directory's real path must lie
  inside the incoming dir; the file itself must not be a symlink and must be a regular file.
  It is opened here (``O_NOFOLLOW | O_NONBLOCK``: a symlink or FIFO swapped in after the check
  cannot redirect or stall the open), checked again on the open descriptor (``fstat``: regular;
  ``/proc/self/fd``: still inside), and the job reads that descriptor.
* **Another repository** (``pool=``, ``source=`` of the pool jobs, declared ``InputKind.REPOSITORY``): the
  rules of ``repo=``, so a queued job can never make one repository read another outside the roots.
* **Input tree** (``source=`` of import_tree): the same rules, but a directory is accepted too
  (the importer walks it without following symlinks). It is checked, not opened.

Every refusal is an :class:`~packyard.store.errors.InvalidInputError` naming the path as given;
nothing outside the roots or the incoming dir is opened to decide it.

    conf = Confinement.from_settings(get_settings())
    repo = conf.repository("default:team/app.git")     # "/srv/repos/team/app.git"
    path, f = conf.open_input("push-123.pack")          # a regular file inside the incoming dir
"""
from __future__ import annotations

import enum
import io
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from packyard.store.errors import InvalidInputError
from packyard.workers.settings import Settings

_ADDRESS = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*):(.*)\Z", re.S)
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class InputKind(enum.Enum):
    """What an input argument may name."""

    FILE = "a regular file"
    FILE_OR_DIRECTORY = "a regular file or a directory"
    #: Another repository the job reads or writes beside ``repo`` (a pool, a pool's source): confined to the
    #: storage roots exactly as ``repo`` is, and passed on as its resolved absolute path.
    REPOSITORY = "a repository inside a storage root"


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _strictly_inside(path: Path, root: Path) -> bool:
    return root in path.parents


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string path, got {type(value).__name__}")
    if not value or "\0" in value:
        raise InvalidInputError(f"{what} must be a non-empty path without NUL bytes")
    return value


@dataclass(frozen=True)
class Confinement:
    roots: tuple[tuple[str, Path], ...]
    incoming: Path

    @classmethod
    def from_settings(cls, settings: Settings) -> "Confinement":
        return cls(settings.storage_roots, settings.incoming_path)

    def _roots_text(self) -> str:
        return ", ".join(f"{name}={path}" for name, path in self.roots)

    # -- repositories ----------------------------------------------------------------------------

    def names_storage(self, value: str) -> bool:
        """Whether ``value`` is ``<storage>:<path>`` for a configured storage (not a path to resolve)."""
        m = _ADDRESS.match(value)
        return m is not None and not value.startswith("/") and m.group(1) in dict(self.roots)

    def spelled_path(self, value: str) -> Path:
        """The absolute path ``value`` names (storage addressing expanded), not yet resolved or checked."""
        m = _ADDRESS.match(value)
        if m and not value.startswith("/"):
            name, rel = m.groups()
            root = dict(self.roots).get(name)
            if root is None:
                raise InvalidInputError(f"repository {value!r} names storage {name!r}, which is not configured "
                                        f"(PACKYARD_STORAGE_ROOTS: {self._roots_text()})")
            if not rel or rel.startswith("/"):
                raise InvalidInputError(f"repository {value!r}: the path after '{name}:' must be relative to the "
                                        "storage")
            return root / rel
        if not os.path.isabs(value):
            raise InvalidInputError(f"repository {value!r} must be an absolute path or <storage>:<relative path>")
        return Path(value)

    def repository(self, value: object) -> str:
        """The resolved absolute path of the repository ``value`` names, if it lies inside a storage root."""
        text = _text(value, "repository")
        real = Path(os.path.realpath(self.spelled_path(text)))
        if not any(_strictly_inside(real, root) for _name, root in self.roots):
            raise InvalidInputError(f"repository is outside the storage roots "
                                    f"(PACKYARD_STORAGE_ROOTS: {self._roots_text()})", path=text)
        return str(real)

    # -- input files -----------------------------------------------------------------------------

    def _input_candidate(self, text: str, what: str) -> Path:
        spelled = Path(text) if os.path.isabs(text) else self.incoming / text
        if spelled.name in ("", ".", ".."):
            raise InvalidInputError(f"{what} must name a file inside the incoming directory", path=text)
        full = Path(os.path.realpath(spelled.parent)) / spelled.name
        if not _strictly_inside(full, self.incoming):
            raise InvalidInputError(f"{what} is outside the incoming directory "
                                    f"(PACKYARD_INCOMING_DIR: {self.incoming})", path=text)
        return full

    def input_path(self, value: object, kind: InputKind, what: str = "input") -> str:
        """Check an input path (not opened): inside the incoming dir, not a symlink, of ``kind``."""
        text = _text(value, what)
        full = self._input_candidate(text, what)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            raise InvalidInputError(f"{what} does not exist", path=text) from None
        except OSError as err:
            raise InvalidInputError(f"{what} cannot be examined: {err.strerror}", path=text) from err
        ok = stat.S_ISREG(st.st_mode) or (kind is InputKind.FILE_OR_DIRECTORY and stat.S_ISDIR(st.st_mode))
        if not ok:
            raise InvalidInputError(f"{what} is {_kind_of(st.st_mode)}, not {kind.value}", path=text)
        return str(full)

    def open_input(self, value: object, what: str = "input") -> tuple[str, BinaryIO]:
        """(resolved path, open binary file) for a regular input file inside the incoming dir."""
        path = self.input_path(value, InputKind.FILE, what)
        text = str(value)
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as err:  # ELOOP: a symlink swapped in since the check
            raise InvalidInputError(f"{what} cannot be opened: {err.strerror}", path=text) from err
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidInputError(f"{what} is {_kind_of(st.st_mode)}, not a regular file", path=text)
            proc = f"/proc/self/fd/{fd}"
            if os.path.exists(proc) and not _strictly_inside(Path(os.readlink(proc)), self.incoming):
                raise InvalidInputError(f"{what} moved outside the incoming directory while being opened", path=text)
            os.set_blocking(fd, True)
            f = io.FileIO(fd, "rb", closefd=True)
        except BaseException:
            os.close(fd)
            raise
        f.name = path  # type: ignore[misc]  # what error messages name (FileIO keeps the fd number otherwise)
        return path, f  # type: ignore[return-value]


def canonical_repo(value: object, settings: Settings) -> str | None:
    """The spelling a job row and a lock use for ``value``: storage addressing expanded, resolved.

    Tolerant (for recording what was asked): a value it cannot read is returned as given.
    """
    if not isinstance(value, str) or not value or "\0" in value:
        return None if value is None else str(value)
    try:
        return os.path.realpath(Confinement.from_settings(settings).spelled_path(value))
    except InvalidInputError:
        return value
