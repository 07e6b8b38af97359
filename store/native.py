"""The package's C extensions: the one place that loads them, one accessor each (None: run the Python).

Each extension holds measured hot loops and is named for what it holds (setup.py builds them); each has a
Python specification that gives the same bytes, which runs when the accessor gives None:

=================  ==========================================================  ==============================
accessor           extension: what it holds                                    the Python it stands in for
=================  ==========================================================  ==============================
:func:`delta`      ``pack._delta``: the delta encoder, the search's window     pack/_delta_py.py, search.py
:func:`walk`       ``maintenance.walk._walk``: the reachability walk, Packs (the    walk/reach.py, sources.py
                   packs' id index), tree and object reads, pack_layout
:func:`packwrite`  ``pack._packwrite``: the repack copy loop, idx/rev tables   writeplan.py, reuse.py, idxwrite.py
:func:`bitmap`     ``maintenance.serving._bitmap``: bitmap closures, EWAH              bitmap.py, ewah.py
:func:`bloom`      ``maintenance.serving._bloom``: Bloom filters, commit-graph reads   bloom.py, commitgraph.py
:func:`fsck`       ``fsck._fsck``: the scan of a clean tree                    fsck/rules.py
:func:`nfsim`      ``workers.nfsim._nfsimd``: nfsim's filesystem (a test and   workers/nfsim/fs.py
                   benchmark tool; built only where libfuse3's headers are)
=================  ==========================================================  ==============================

_packwrite, _bitmap and _bloom read objects through _walk's Packs and reader (its C API capsule): they load
only with it. ``PACKYARD_PURE_PYTHON=1`` selects the Python everywhere (CI runs the tests both ways); an
extension that was not built (no compiler at install time) does the same for its part, unless
``PACKYARD_REQUIRE_C=1``: then its accessor raises :class:`MissingExtensionError` naming it and why, when
the module that uses it loads (CI sets it, so a failed build fails the tests instead of running the Python).
"""
from __future__ import annotations

import importlib
import os
from typing import Any

#: accessor name -> the extension's module (absolute name).
EXTENSIONS = {
    "delta": "packyard.store.pack._delta",
    "walk": "packyard.store.maintenance.walk._walk",
    "packwrite": "packyard.store.pack._packwrite",
    "bitmap": "packyard.store.maintenance.serving._bitmap",
    "bloom": "packyard.store.maintenance.serving._bloom",
    "fsck": "packyard.store.fsck._fsck",
    "nfsim": "packyard.workers.nfsim._nfsimd",
}


class MissingExtensionError(ImportError):
    """PACKYARD_REQUIRE_C=1 and an extension was not built or does not load (the message names it and why)."""


def pure_python() -> bool:
    """PACKYARD_PURE_PYTHON=1: every part runs its Python implementation."""
    return os.environ.get("PACKYARD_PURE_PYTHON") == "1"


def require_c() -> bool:
    """PACKYARD_REQUIRE_C=1: every extension must be built and load (each accessor checks its own)."""
    return os.environ.get("PACKYARD_REQUIRE_C") == "1"


_loaded: dict[str, Any] = {}   # accessor name -> the module, or None when it does not load
_why: dict[str, str] = {}


def _try(name: str) -> Any:
    """The extension of accessor ``name``, imported once; None when it does not load (why in _why)."""
    if name not in _loaded:
        module = EXTENSIONS[name]
        try:
            _loaded[name] = importlib.import_module(module)
        except ImportError as err:
            _loaded[name] = None
            _why[name] = f"{module}: {err}"
    return _loaded[name]


def _get(name: str) -> Any:
    """The one loading rule: import the extension once (on first use: importing them all here would run
    the packages' own imports in the middle of theirs); None when it does not load or pure Python is asked
    for; MissingExtensionError when it does not load and PACKYARD_REQUIRE_C=1 (even with pure Python asked
    for: the variable means "every extension is built and loads")."""
    if pure_python() and not require_c():
        return None
    if _try(name) is None and require_c():
        raise MissingExtensionError(f"PACKYARD_REQUIRE_C=1 but the C extension does not load: {_why[name]}")
    return None if pure_python() else _loaded[name]


# Typed Any: the extensions have no stubs (callers check for None before use).
def delta() -> Any:
    """``pack._delta`` (DeltaIndex, search_segment, name_hash), or None."""
    return _get("delta")


def walk() -> Any:
    """``maintenance.walk._walk`` (Packs, Walker, WalkError, pack_layout, MAX_CHAIN), or None."""
    return _get("walk")


def packwrite() -> Any:
    """``pack._packwrite`` (find_reuse, write_order, copy_entries, check_chains, index_tables), or None."""
    return _get("packwrite")


def bitmap() -> Any:
    """``maintenance.serving._bitmap`` (bitmap_commits, bitmap_closures, ewah_stored), or None."""
    return _get("bitmap")


def bloom() -> Any:
    """``maintenance.serving._bloom`` (bloom_filters, commit_reads), or None."""
    return _get("bloom")


def fsck() -> Any:
    """``fsck._fsck`` (check_tree_fast), or None."""
    return _get("fsck")


def nfsim() -> Any:
    """``workers.nfsim._nfsimd`` (serve), or None: nfsim's simulated NFS client in C (fs.py is its Python)."""
    return _get("nfsim")


def missing() -> list[str]:
    """The extensions that do not load, each with why (empty when all are built): loads every one."""
    return [_why[name] for name in EXTENSIONS if _try(name) is None]


__all__ = ["EXTENSIONS", "MissingExtensionError", "bitmap", "bloom", "delta", "fsck", "missing", "nfsim",
           "packwrite", "pure_python", "require_c", "walk"]
