"""unpack_objects: Explode a small pack into loose objects, then apply ref updates."""
from __future__ import annotations

from typing import Any, BinaryIO

from packyard.workers.app import app
from packyard.workers.commands import unpack_objects as command
from packyard.workers.confine import InputKind
from packyard.workers.settings import get_settings
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.unpack_objects", bind=True, base=PackyardTask, inputs={"pack_path": InputKind.FILE})
def unpack_objects(self: PackyardTask, repo: str, pack_path: str,
                   ref_updates: list[dict] | None = None, strict: bool = False) -> dict[str, Any]:
    """Explode a small pack into loose objects, then apply ref updates.
    PACKYARD_RECEIVE_FSCK (default on) makes it strict whatever ``strict`` says (a message may ask for more)."""
    f: BinaryIO = pack_path  # type: ignore[assignment]  # a file in the incoming dir, opened by the task boundary
    s = get_settings()
    strict = bool(strict) or s.receive_fsck
    with self.repo_lock(repo) as lease:
        return self.call(command.unpack_objects, repo, f, ref_updates=ref_updates,
                         max_bytes=s.max_pack_bytes, lease=lease, strict=strict,
                         fsck=s.fsck_options if strict else None)
