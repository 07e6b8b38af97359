"""The package's C extensions, or None when the pure-Python paths must run.

Hot loops with a C implementation built by the package's own build (setup.py) and a Python
specification that gives the same results: the delta encoder and search window (``pack._delta``),
the reachability walk and the repack copy loop (``maintenance._walk``), the commit-graph's Bloom
filters and commit reads (``maintenance._walk`` too: ``bloom.filters``, tests/test_bloom_c.py).
``PACKYARD_PURE_PYTHON=1`` selects the Python paths everywhere (CI runs the tests both ways); an
extension that was not built (no compiler at install time) does the same for its part.
"""
from __future__ import annotations

import importlib
import os
from typing import Any


def pure_python() -> bool:
    """PACKYARD_PURE_PYTHON=1: every part runs its Python implementation."""
    return os.environ.get("PACKYARD_PURE_PYTHON") == "1"


def extension(module: str) -> Any:
    """The built extension ``module`` (absolute name), or None if absent or pure Python is asked for.
    Typed Any: the extensions have no stubs (callers check for None before use)."""
    if pure_python():
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


__all__ = ["extension", "pure_python"]
