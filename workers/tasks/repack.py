"""repack: full, geometric or loose repack of a repository under its maintenance lease."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import repack as command
from packyard.workers.settings import Settings
from packyard.workers.tasks.base import PackyardTask
from packyard.workers.tasks.boundary import PRESERVATION


def _ignores_members(value: Any, settings: Settings) -> str | None:
    return "true prunes a pool's objects that only its members reach" if value is True else None


@app.task(name="packyard.repack", bind=True, base=PackyardTask,
          unsafe={**PRESERVATION, "unsafe_ignore_pool_members": _ignores_members})
def repack(self: PackyardTask, repo: str, mode: str = "full", factor: int = 2, expire: str | float | None = None,
           preserve_for: float | None = None, preserve: bool = True, wait: float | None = None,
           on_busy: str = "wait", no_reuse: bool = False, window: int | None = None,
           depth: int | None = None, no_bitmap: bool = False, commit_graph: bool = True,
           pack_refs: bool = True, no_midx: bool = False, islands: list[str] | None = None,
           island_core: str | None = None, unsafe_ignore_pool_members: bool = False) -> dict[str, Any]:
    """Repack under the maintenance lease (waits ``wait`` s for it, or ``on_busy="skip"``s: scheduled runs); its
    token fences the deletions. ``no_reuse`` recomputes every delta (``window``/``depth`` as git names them);
    ``no_bitmap``: a full repack writes no reachability bitmap.
    ``preserve=False`` (unlink replaced packs at once) is the race harness's unsafe negative control, never a
    default; so is ``unsafe_ignore_pool_members`` (a pool repacked without its members' refs: the pool race's
    control). ``commit_graph``/``pack_refs``: write the commit-graph and pack the refs afterwards (default)."""
    self.bind_log(mode=mode)
    with self.maintenance_lock(repo, wait=wait, on_busy=on_busy) as lease:
        return self.call(command.repack, repo, mode=mode, factor=factor, expire=expire,
                         preserve_for=preserve_for, preserve=preserve, no_reuse=no_reuse, window=window,
                         depth=depth, no_bitmap=no_bitmap, lease=lease, commit_graph=commit_graph,
                         pack_refs=pack_refs, no_midx=no_midx, islands=islands, island_core=island_core,
                         unsafe_ignore_pool_members=unsafe_ignore_pool_members)
