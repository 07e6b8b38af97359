"""Fixtures for the tests with real worker processes (the session's fixtures are in tests/conftest.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

import repackutil as ru
from procutil import wait_until  # noqa: F401  (`from conftest import wait_until` finds it whichever conftest is loaded)


@pytest.fixture
def shapes(template: ru.Shapes, store_root: Path) -> ru.Shapes:
    """A copy of the repack shapes under the storage root: queued jobs address repositories only there."""
    return ru.copy(template, store_root / "repo.git")
