"""PACKYARD_IO_THREADS: the server's bound on filesystem calls in flight (store/fsparallel.py)."""
from __future__ import annotations

import pytest

from packyard.store import fsparallel
from packyard.workers.settings import SettingsError, get_settings


def test_the_store_knob_follows_the_settings_and_refuses_less_than_one(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        fsparallel.set_io_threads(0)
    before = fsparallel.io_threads()
    try:
        monkeypatch.setenv("PACKYARD_IO_THREADS", "3")
        assert get_settings().io_threads == 3 and fsparallel.io_threads() == 3
        assert get_settings().as_env()["PACKYARD_IO_THREADS"] == "3"
        monkeypatch.setenv("PACKYARD_IO_THREADS", "0")
        with pytest.raises(SettingsError, match="PACKYARD_IO_THREADS"):
            get_settings()
    finally:
        fsparallel.set_io_threads(before)
