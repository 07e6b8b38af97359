"""Fixtures the receive tests share (the session's services are tests/conftest.py's)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (a unix socket's path is at most 107 bytes; tmp_path's may be longer)."""
    path = Path(tempfile.mkdtemp(prefix="pky-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
