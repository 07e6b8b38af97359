"""write_objects: Write raw objects (type + base64 data, or a file in the incoming dir) in one batch, then refs."""
from __future__ import annotations

from typing import Any, BinaryIO

from packyard.workers.app import app
from packyard.workers.commands import write_objects as command
from packyard.workers.confine import InputKind
from packyard.workers.settings import get_settings
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.write_objects", bind=True, base=PackyardTask, inputs={"objects_file": InputKind.FILE})
def write_objects(self: PackyardTask, repo: str, objects: list[dict] | None = None,
                  ref_updates: list[dict] | None = None, objects_file: str | None = None) -> dict[str, Any]:
    """Write raw objects (message: base64, up to PACKYARD_WRITE_OBJECTS_MAX_BYTES; or ``objects_file``), then refs."""
    s = get_settings()
    f: BinaryIO | None = objects_file  # type: ignore[assignment]  # opened by the task boundary
    with self.repo_lock(repo) as lease:
        return self.call(command.write_objects, repo, objects, objects_file=f, ref_updates=ref_updates,
                         max_payload_bytes=s.write_objects_max_bytes, max_file_bytes=s.objects_file_max_bytes,
                         pack_threshold=s.pack_threshold, lease=lease)
