"""The batch-write entry points: :func:`begin` (the one place that picks a loose or a pack batch) and
:func:`write_objects` (a caller's list of raw objects, validated by git's fsck, then written in one batch).
"""
from __future__ import annotations

from typing import Sequence

from ..errors import InvalidInputError
from ..fsck import STRICT, FsckOptions, check_batch
from ..objects import ObjectType, hash_object
from ..refs import RefUpdate
from ..tuning import gc_paused
from .contract import Batch, BatchCounters, BatchResult, Progress, WriteResult
from .loose import LooseBatch
from .pack import PackBatch

#: Batches of at least this many objects are written as one pack (store/batch/pack.py) instead of loose
#: files by ``write_objects`` and ``import_tree`` (workers: PACKYARD_PACK_THRESHOLD).
PACK_THRESHOLD = 1000


def should_write_pack(count: int, threshold: int | None) -> bool:
    """Pure question: is a batch of ``count`` objects written as one pack (``threshold`` None: never)?"""
    return threshold is not None and threshold > 0 and count >= threshold


def begin(repo, *, count_hint: int | None = None, pack_threshold: int | None = PACK_THRESHOLD,
          counters: BatchCounters | None = None, progress: Progress | None = None, expected: int | None = None,
          **options) -> Batch:
    """Start a batch (it takes the one snapshot and removes leftovers of dead writers): one pack with computed
    deltas when the caller expects at least ``pack_threshold`` objects (``count_hint``), else loose files.
    No ``count_hint`` (a count not known up front, or input a pack batch could not hold): loose. ``options``
    are either batch's (both accept the loose batch's flush options; a pack batch ignores them)."""
    if count_hint is not None and should_write_pack(count_hint, pack_threshold):
        return PackBatch(repo, counters=counters, progress=progress, expected=expected, **options)
    return LooseBatch(repo, counters=counters, progress=progress, expected=expected, **options)


def validate_object(obj_type: ObjectType, data: bytes, index: int) -> None:
    """Structural check of a caller-supplied object, so nothing git fsck would reject is written."""
    from ..errors import CorruptObjectError
    from ..parse import object_links  # local: parse is only needed for caller-supplied objects
    try:
        object_links(obj_type, data, hash_object(obj_type, data))
    except CorruptObjectError as err:
        raise InvalidInputError(f"object #{index} is not a well-formed {obj_type.label.decode()}: "
                                f"{err.message}", oid=err.oid) from err


def object_type_of(value: object, index: int) -> ObjectType:
    """The type of caller-supplied object #``index``: an ObjectType, a name (``"blob"``, ``b"tree"``) or git's
    type number (1 commit, 2 tree, 3 blob, 4 tag, as in a pack entry header). Anything else (5, None, True,
    "Blob") is an InvalidInputError naming the object and the value, never a bare ValueError."""
    if type(value) is ObjectType:
        return value
    if isinstance(value, (str, bytes)):
        try:
            return ObjectType.from_label(value)
        except InvalidInputError:
            pass
    elif type(value) is int and value in ObjectType._value2member_map_:
        return ObjectType(value)
    raise InvalidInputError(f"object #{index}: {value!r} is not an object type (want commit, tree, blob or tag; "
                            "or git's type numbers 1-4)")


@gc_paused()   # many long-lived acyclic objects: see store/tuning.py
def fsck_objects(repo, typed: Sequence[tuple[ObjectType, bytes]], opts: FsckOptions, *,
                 require_links: bool = False, known: dict[bytes, int] | None = None,
                 oids: Sequence[bytes] | None = None, large: dict[bytes, int] | None = None) -> None:
    """git's fsck over objects about to be written to ``repo`` (FsckError / ObjectMissingError).
    Existence and types of linked objects come from one snapshot of the repository. Without
    ``require_links`` a link to an object nowhere (and a .gitmodules blob nowhere) is not refused."""
    from dataclasses import replace

    snap = repo.objects.snapshot()
    if not require_links:
        opts = replace(opts, missing_gitmodules_is_error=False)

    def existing_type(oid: bytes) -> int | None:   # has(): a miss is looked up afresh before it is "absent"
        return int(snap.read_header(oid)[0]) if snap.has(oid) else None

    def read_existing(oid: bytes) -> tuple[int, bytes] | None:
        if not snap.has(oid):
            return None
        t, data = snap.read(oid)
        return int(t), data

    ids = oids if oids is not None else [hash_object(t, data) for t, data in typed]
    check_batch(((int(t), data, oid) for (t, data), oid in zip(typed, ids)), opts, existing_type, read_existing,
                require_links=require_links, known=known, large=large)


def write_objects(repo, objects: Sequence[tuple[ObjectType | int | str, bytes]], *,
                  ref_updates: Sequence[RefUpdate] = (), counters: BatchCounters | None = None,
                  progress: Progress | None = None, pack_threshold: int | None = PACK_THRESHOLD,
                  fsck: FsckOptions | None = None,
                  **batch_options) -> tuple[list[tuple[bytes, WriteResult]], BatchResult]:
    """Validate every object first, then write them in one batch and apply ``ref_updates``: loose files,
    or one pack with computed deltas (store/batch/pack.py) when there are at least ``pack_threshold``
    objects (None: never); the counters' ``write_path`` says which.

    Validation is git's fsck (store/fsck, ``fsck`` or git's strict defaults): every object, every link
    that names a known object names one of the type it claims, .gitmodules blobs checked. A link to an
    object neither here nor in the repository is allowed (a frontend may write a history in several
    batches); a refusal raises FsckError and nothing is written."""
    typed: list[tuple[ObjectType, bytes]] = []
    for i, (t, data) in enumerate(objects):
        obj_type = object_type_of(t, i)
        validate_object(obj_type, data, i)
        typed.append((obj_type, data))
    fsck_objects(repo, typed, fsck or STRICT)
    with begin(repo, count_hint=len(typed), pack_threshold=pack_threshold, counters=counters, progress=progress,
               expected=len(typed), **batch_options) as batch:
        results = batch.add_many(typed)
        result = batch.commit(ref_updates)
    return results, result
