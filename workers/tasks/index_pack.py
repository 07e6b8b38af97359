"""index_pack: ingest a pushed pack into a repository (install + optional ref updates)."""
from __future__ import annotations

from typing import Any, BinaryIO

from packyard.workers.app import app
from packyard.workers.commands import index_pack as command
from packyard.workers.confine import InputKind
from packyard.workers.settings import get_settings
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.index_pack", bind=True, base=PackyardTask, inputs={"pack": InputKind.FILE})
def index_pack(self: PackyardTask, repo: str, pack: str, fix_thin: bool = False, strict: bool = False,
               keep: str | None = None, ref_updates: list[dict] | None = None,
               max_pack_bytes: int | None = None) -> dict[str, Any]:
    """Verify, resolve and index a pack in quarantine; install it and update refs under the repo lease.
    PACKYARD_RECEIVE_FSCK (default on) makes it strict whatever ``strict`` says (a message may ask for more)."""
    f: BinaryIO = pack  # type: ignore[assignment]  # a file in the incoming dir, opened by the task boundary
    self.bind_log(pack=f.name)
    s = get_settings()
    ceiling = s.max_pack_bytes   # a message may lower the limit, not raise it
    limit = ceiling if max_pack_bytes is None else min(max_pack_bytes, ceiling)
    strict = bool(strict) or s.receive_fsck
    return self.call(command.index_pack, repo, f, fix_thin=fix_thin, strict=strict,
                     fsck=s.fsck_options if strict else None, keep=keep,
                     ref_updates=ref_updates, max_pack_bytes=limit,
                     lock=lambda: self.repo_lock(repo))
