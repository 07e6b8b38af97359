"""Declared once: the progress callback type lives in store/progress.py and every module imports it from there."""
from __future__ import annotations

import re

from gitutil import ROOT

_ALIAS = re.compile(r"^\s*Progress\s*(?::\s*\w+\s*)?=", re.M)


def test_the_progress_type_is_declared_only_in_store_progress():
    declared = sorted(str(p.relative_to(ROOT)) for top in ("store", "workers", "tests")
                      for p in (ROOT / top).rglob("*.py") if _ALIAS.search(p.read_text()))
    assert declared == ["store/progress.py"]
