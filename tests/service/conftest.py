"""Fixtures for the tests with real worker processes (the session's fixtures are in tests/conftest.py)."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

import repackutil as ru
from procutil import wait_until  # noqa: F401  (`from conftest import wait_until` finds it whichever conftest is loaded)


@pytest.fixture
def shapes(template: ru.Shapes, store_root: Path) -> ru.Shapes:
    """A copy of the repack shapes under the storage root: queued jobs address repositories only there."""
    return ru.copy(template, store_root / "repo.git")


@pytest.fixture
def nfsim_hosts(tmp_path: Path):
    """mount(name, **options) -> an nfsim.Mount of one shared backing dir (``mount.backing``): one simulated NFS
    client host per mount; every mount closed at the end. Skips where nfsim cannot mount."""
    from packyard.workers import nfsim

    reason = nfsim.unavailable()
    if reason is not None:
        pytest.skip(f"nfsim cannot mount here: {reason}")
    backing = tmp_path / "server"
    backing.mkdir()
    mounts: list = []

    def mount(name: str, **opts):
        opts.setdefault("latency", 0.0)
        m = nfsim.Mount(backing, tmp_path / name, name=name, **opts)
        mounts.append(m)
        return m

    mount.backing = backing  # type: ignore[attr-defined]
    yield mount
    # A test's store objects (packs it has open or mapped on a mount) often sit in reference cycles, a raised
    # error's traceback among them; until they are collected the lazily unmounted daemon keeps serving them and
    # Mount.close waits out its 20 s before killing it.
    gc.collect()
    for m in reversed(mounts):
        m.close()
