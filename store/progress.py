"""The one progress callback type: ``progress(phase, done, total)``, ``total`` None when unknown.

Store operations and worker commands take ``progress: Progress | None``; the CLI drives tqdm bars with it
(workers/cli/progress.py) and a queued task reports Celery state with it (workers/tasks/base.py).
"""
from __future__ import annotations

from typing import Callable

Progress = Callable[[str, int, "int | None"], None]
