"""The stateful side of fsck for one incoming batch (a pack, an unpack, a write): git's
``fsck_object`` per object, the links each object claims (by type), the blobs found at a
``.gitmodules`` name, and ``fsck_finish``: the late checks once every object is known.

:class:`FsckState` is plain data (picklable: forked resolvers send theirs back to merge).
"""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from ..errors import FsckError, ObjectMissingError
from ..objects import ObjectType
from .linkset import LinkSet
from .msgs import LINK_TYPE, FsckOptions, Severity
from .rules import (
    BLOB,
    COMMIT,
    GITATTRIBUTES_IDS,
    TAG,
    TREE,
    ObjectReport,
    Refused,
    check_commit,
    check_gitattributes_blob,
    check_gitmodules_blob,
    check_tag,
    check_tree,
    check_tree_fast,
)

_R = TypeVar("_R")

_LABEL = {BLOB: "blob", TREE: "tree", COMMIT: "commit", TAG: "tag"}


def fsck_error(oid: bytes, msg_id: str, text: str, tree_path: str | None = None, *, path: object = None,
               offset: int | None = None) -> FsckError:
    msg = f"{oid.hex()}: {msg_id}: {text}" + (f" [path {tree_path}]" if tree_path else "")
    return FsckError(msg, msg_id=msg_id, tree_path=tree_path, oid=oid, path=path, offset=offset)


class FsckState:
    """What the per-object checks leave for :meth:`FsckChecker.finish`."""

    __slots__ = ("links", "gitmodules", "gitmodules_done", "gitattributes", "gitattributes_done", "warnings")

    def __init__(self) -> None:
        # packed ids (store/fsck/linkset.py): a set of bytes cost ~100 bytes an id, 16 MiB for git.git
        self.links: dict[int, LinkSet] = {BLOB: LinkSet(), TREE: LinkSet(), COMMIT: LinkSet(), TAG: LinkSet()}
        self.gitmodules: dict[bytes, str] = {}      # blob id -> the name it was found at
        self.gitmodules_done: set[bytes] = set()
        # git's gitattributes_found / _done (2.39.1+): recorded unless every one of its ids is IGNORE
        self.gitattributes: dict[bytes, str] = {}
        self.gitattributes_done: set[bytes] = set()
        self.warnings: list[str] = []

    def __getstate__(self):
        return (self.links, self.gitmodules, self.gitmodules_done, self.gitattributes, self.gitattributes_done,
                self.warnings)

    def __setstate__(self, st) -> None:
        (self.links, self.gitmodules, self.gitmodules_done, self.gitattributes, self.gitattributes_done,
         self.warnings) = st

    def has_queued_checks(self) -> bool:
        """git's fsck_has_queued_checks: a .gitmodules or .gitattributes blob not checked yet."""
        return bool(set(self.gitmodules) - self.gitmodules_done or set(self.gitattributes) - self.gitattributes_done)

    def merge(self, other: "FsckState") -> None:
        for t, s in other.links.items():
            self.links[t].merge(s)
        for oid, name in other.gitmodules.items():
            self.gitmodules.setdefault(oid, name)
        self.gitmodules_done |= other.gitmodules_done
        for oid, name in other.gitattributes.items():
            self.gitattributes.setdefault(oid, name)
        self.gitattributes_done |= other.gitattributes_done
        self.warnings.extend(other.warnings[:max(0, 100 - len(self.warnings))])


class FsckChecker:
    """fsck for a batch of objects under ``opts``; raises :class:`FsckError` at the first refusal."""

    def __init__(self, opts: FsckOptions, state: FsckState | None = None) -> None:
        self.opts = opts
        self.state = state if state is not None else FsckState()
        self._blob_links = self.state.links[BLOB]
        self._tree_links = self.state.links[TREE]
        self._allow_664 = not opts.refuses("badFilemode")
        # the .gitattributes blob checks (ERROR by default): skipped only when all their ids are ignored
        self._attrs = any(opts.severity(m) != Severity.IGNORE for m in GITATTRIBUTES_IDS)

    def _raise(self, rep: ObjectReport, where: object, offset: int | None, refuse: bool = True) -> None:
        """Keep the object's warnings; if git's result refuses it, raise its first error-level finding."""
        st = self.state
        for msg_id, text, path in rep.warnings:
            if len(st.warnings) < 100:
                st.warnings.append(f"{rep.oid.hex()}: {msg_id}: {text}" + (f" [path {path}]" if path else ""))
        if refuse and rep.findings:
            msg_id, text, path = rep.findings[0]
            raise fsck_error(rep.oid, msg_id, text, path, path=where, offset=offset)

    def _run(self, check_fn: Callable[[bytes, ObjectReport], _R], data: bytes, oid: bytes, where: object,
             offset: int | None) -> tuple[_R, ObjectReport]:
        """``check_fn(data, report)`` for one object: (its result, the report); a Refused (git dies before it
        reports anything) raised as the typed error naming the object."""
        rep = ObjectReport(self.opts, oid)
        try:
            return check_fn(data, rep), rep
        except Refused as r:
            raise fsck_error(oid, r.msg_id, r.text, path=where, offset=offset) from None

    def check(self, obj_type: int, data: bytes, oid: bytes, *, where: object = None,
              offset: int | None = None) -> None:
        """fsck_object + the walk's links for one object (a blob only if found at .gitmodules)."""
        if obj_type == TREE:
            got = check_tree_fast(data, self._allow_664, self._attrs)   # what it accepts has no refusable finding
            if got is not None:
                self._blob_links.update(got[0])
                self._tree_links.update(got[1])
                for goid, name in got[2]:
                    self.state.gitattributes.setdefault(goid, name.decode("utf-8", "backslashreplace"))
                return
            (ret, blobs, trees, gitmodules, gitattributes), rep = self._run(check_tree, data, oid, where, offset)
            self._blob_links.update(blobs)
            self._tree_links.update(trees)
            for goid, name in gitmodules:
                self.state.gitmodules.setdefault(goid, name.decode("utf-8", "backslashreplace"))
            if self._attrs:
                for goid, name in gitattributes:
                    self.state.gitattributes.setdefault(goid, name.decode("utf-8", "backslashreplace"))
            self._raise(rep, where, offset, bool(ret))
        elif obj_type == COMMIT:
            (ret, tree, parents), rep = self._run(check_commit, data, oid, where, offset)
            self._raise(rep, where, offset, bool(ret))
            if tree is not None:
                self._tree_links.add(tree)
            self.state.links[COMMIT].update(parents)
        elif obj_type == TAG:
            (ret, target, ttype), rep = self._run(check_tag, data, oid, where, offset)
            self._raise(rep, where, offset, bool(ret))
            if target is not None:
                self.state.links[ttype].add(target)
        elif obj_type == BLOB:
            found_at = self.state.gitmodules.get(oid)
            if found_at is not None:
                self.check_gitmodules(oid, data, found_at, where=where, offset=offset)
            found_at = self.state.gitattributes.get(oid) if self._attrs else None
            if found_at is not None:
                self.check_gitattributes(oid, data, found_at, where=where, offset=offset)

    def check_gitmodules(self, oid: bytes, data: bytes, name: str, *, where: object = None,
                         offset: int | None = None) -> None:
        self._check_found_blob(self.state.gitmodules_done, check_gitmodules_blob, oid, data, name, where, offset)

    def check_gitattributes(self, oid: bytes, data: bytes, name: str, *, where: object = None,
                            offset: int | None = None) -> None:
        self._check_found_blob(self.state.gitattributes_done, check_gitattributes_blob, oid, data, name, where,
                               offset)

    def check_received(self, obj_type: int, data: bytes | None, oid: bytes, size: int, *, where: object = None,
                       offset: int | None = None) -> None:
        """One object as index-pack receives it: a blob over ``opts.big_file_threshold`` judged by its ``size``
        (:meth:`check_large_blob`: git holds no buffer for it), anything else by its content (:meth:`check`).
        ``data`` None: not held (a blob inflated in pieces and let go; fsck_finish reads it if it must)."""
        if obj_type == BLOB and size > self.opts.big_file_threshold:
            self.check_large_blob(oid, size, where=where, offset=offset)
        elif data is not None:
            self.check(obj_type, data, oid, where=where, offset=offset)

    def check_large_blob(self, oid: bytes, size: int, *, where: object = None, offset: int | None = None) -> None:
        """git's fsck_blob without a buffer (index-pack holds no blob over core.bigFileThreshold): if this blob was
        found at a .gitmodules name it is gitmodulesLarge, at a .gitattributes name gitattributesLarge; either
        way it is done (never read). One not found yet is left to fsck_finish, which reads it, as git's does.
        :meth:`check_received` calls it for a blob over ``opts.big_file_threshold`` (index-pack's receive,
        check_batch); unpack-objects never does (git's reads such a blob whole in fsck_finish)."""
        for found, done, msg_id, label in (
                (self.state.gitmodules, self.state.gitmodules_done, "gitmodulesLarge", ".gitmodules"),
                (self.state.gitattributes if self._attrs else {}, self.state.gitattributes_done, "gitattributesLarge",
                 ".gitattributes")):
            name = found.get(oid)
            if name is None:
                continue
            done.add(oid)
            if oid in self.opts.skiplist:
                continue
            rep = ObjectReport(self.opts, oid)
            rep(msg_id, f"{label} too large to parse ({size} bytes, over {self.opts.big_file_threshold})", name)
            self._raise(rep, where, offset, True)

    def _check_found_blob(self, done: set[bytes], check_fn: Callable[[bytes, ObjectReport, str | None], int],
                          oid: bytes, data: bytes, name: str, where: object, offset: int | None) -> None:
        """git's fsck_blob for a blob found at a special name: marked done, skip-listed ones dropped."""
        done.add(oid)
        if oid in self.opts.skiplist:
            return
        rep = ObjectReport(self.opts, oid)
        self._raise(rep, where, offset, bool(check_fn(data, rep, name)))

    # -- fsck_finish ----------------------------------------------------------------------------
    def finish(self, incoming_type: Callable[[bytes], int | None], existing_type: Callable[[bytes], int | None],
               read: Callable[[bytes], tuple[int, bytes] | None], *, where: object = None) -> None:
        """Late checks, once every object is known.

        ``incoming_type(oid)``: the type of an object of this batch, or None; ``existing_type(oid)``:
        of an object already in the repository, or None; ``read(oid)``: (type, bytes) from either.
        Order: links (each names an object of the type it claims, in the batch or the repository;
        a missing one is ObjectMissingError), then every .gitmodules blob not checked yet.
        """
        self.check_links(incoming_type, existing_type, where=where)
        self.finish_gitmodules(read, where=where)

    def finish_gitmodules(self, read: Callable[[bytes], tuple[int, bytes] | None], *, where: object = None) -> None:
        """fsck_finish: every blob found at a .gitmodules (then a .gitattributes) name and not checked
        yet, read now (git's fsck_blobs, once per kind)."""
        st = self.state
        self._finish_blobs(st.gitmodules, st.gitmodules_done, "gitmodulesMissing", "gitmodulesBlob", ".gitmodules",
                           self.check_gitmodules, read, where, missing_is_error=self.opts.missing_gitmodules_is_error)
        self._finish_blobs(st.gitattributes, st.gitattributes_done, "gitattributesMissing", "gitattributesBlob",
                           ".gitattributes", self.check_gitattributes, read, where,
                           missing_is_error=self.opts.missing_gitmodules_is_error)

    def _finish_blobs(self, found: dict[bytes, str], done: set[bytes], msg_missing: str, msg_type: str, label: str,
                      check: Callable[..., None], read: Callable[[bytes], tuple[int, bytes] | None],
                      where: object, *, missing_is_error: bool) -> None:
        for oid in sorted(found):
            if oid in done:
                continue
            name = found[oid]
            got = read(oid)
            if got is None:
                if not missing_is_error:
                    continue       # index-pack prints it (receive-pack decides); not a refusal
                rep = ObjectReport(self.opts, oid)
                rep(msg_missing, f"unable to read {label} blob", name)
                self._raise(rep, where, None)
                continue
            typ, data = got
            if typ == BLOB:
                check(oid, data, name, where=where)
            else:
                rep = ObjectReport(self.opts, oid)
                rep(msg_type, f"non-blob found at {label}", name)
                self._raise(rep, where, None)

    def check_links(self, incoming_type: Callable[[bytes], int | None],
                    existing_type: Callable[[bytes], int | None], *, where: object = None,
                    incoming_sets: dict[int, set[bytes]] | None = None, require: bool = True) -> None:
        """Every link names an object of the type it claims; a missing one raises ObjectMissingError.
        ``incoming_sets`` (type -> ids of the batch), when given, answers in bulk before ``incoming_type``."""
        links = self.state.links
        for t in (COMMIT, TREE, BLOB, TAG):
            todo: Iterable[bytes] = links[t]           # sorted, each once
            if incoming_sets is not None:
                theirs = incoming_sets.get(t, set())
                todo = [oid for oid in links[t] if oid not in theirs]
            for oid in todo:
                got = incoming_type(oid)
                if got is None:
                    got = existing_type(oid)
                    if got is None:
                        if not require:
                            continue
                        raise ObjectMissingError("--strict: did not receive expected object (linked from an "
                                                 f"incoming object as a {_LABEL[t]}, absent from the pack and "
                                                 "the repository)", oid=oid, path=where)
                if got != t:
                    raise fsck_error(oid, LINK_TYPE, f"object is a {_LABEL.get(got, got)}, "
                                     f"linked as a {_LABEL[t]}", path=where)


def check_batch(objects: Iterable[tuple[int, bytes, bytes]], opts: FsckOptions,
                existing_type: Callable[[bytes], int | None],
                read_existing: Callable[[bytes], tuple[int, bytes] | None], *, require_links: bool,
                where: object = None, known: dict[bytes, int] | None = None,
                large: dict[bytes, int] | None = None) -> FsckChecker:
    """fsck a batch of (type, data, oid) built or received in memory (write_objects, import_tree): every
    object, every link's type (``require_links``: and presence), the .gitmodules blobs. ``known``: ids
    of the batch (-> type) that were not passed as objects (import_tree's blobs); ``large``: blobs of the batch
    never held in memory (id -> size; import_tree's streamed files). The blobs are checked after every other
    object, the order git's pack-objects writes a push in (commits, trees, then blobs), so a blob at a
    .gitmodules name is known as one when it is checked, whatever order the caller built the batch in: one
    over ``opts.big_file_threshold`` is then judged as git's index-pack judges it (gitmodulesLarge)."""
    checker = FsckChecker(opts)
    ours: dict[bytes, tuple[int, bytes]] = {}
    for t, data, oid in objects:
        ours[oid] = (int(t), data)
    for blobs in (False, True):
        for oid, (t, data) in ours.items():
            if (t == BLOB) == blobs:
                checker.check_received(t, data, oid, len(data), where=where)
    for oid, size in sorted((large or {}).items()):
        checker.check_large_blob(oid, size, where=where)
    extra = known or {}

    def incoming_type(oid: bytes) -> int | None:
        got = ours.get(oid)
        return got[0] if got is not None else extra.get(oid)

    def read(oid: bytes) -> tuple[int, bytes] | None:
        return ours.get(oid) or read_existing(oid)

    checker.check_links(incoming_type, existing_type, where=where, require=require_links)
    checker.finish_gitmodules(read, where=where)
    return checker


def object_label(t: int) -> str:
    return ObjectType(t).label.decode()
