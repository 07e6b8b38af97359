"""docs/settings.md names every PACKYARD_* variable workers/settings.py reads, and no other: the table cannot
drift from the code (a variable added without its line, or a line left for a variable no longer read)."""
from __future__ import annotations

import re

from gitutil import ROOT


def _read_by_settings() -> set[str]:
    code = (ROOT / "workers" / "settings.py").read_text()
    return set(re.findall(r'"(PACKYARD_[A-Z0-9_]+)"', code))


def _documented() -> set[str]:
    doc = (ROOT / "docs" / "settings.md").read_text()
    return set(re.findall(r"^(PACKYARD_[A-Z0-9_]+)\s", doc, re.M))


def test_every_variable_the_settings_read_is_in_the_table() -> None:
    read, documented = _read_by_settings(), _documented()
    assert len(read) > 60, sorted(read)
    assert read - documented == set(), f"read but not in docs/settings.md: {sorted(read - documented)}"
    assert documented - read == set(), f"in docs/settings.md but never read: {sorted(documented - read)}"


def test_each_variable_read_round_trips_through_as_env() -> None:
    """A worker started with ``as_env()`` gets every setting: each variable read is also one as_env writes."""
    from packyard.workers.settings import Settings

    written = set(Settings.from_env({}).as_env())
    assert _read_by_settings() - written == set(), sorted(_read_by_settings() - written)
