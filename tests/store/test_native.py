"""store/native.py, the one place that loads the C extensions: PACKYARD_REQUIRE_C=1 (every extension built and
loading, else MissingExtensionError naming it), PACKYARD_PURE_PYTHON=1 (the Python everywhere), and no other
module importing an extension or another module's private handle on one."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gitutil import ROOT
from packyard.store import native


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PACKYARD_REQUIRE_C", "PACKYARD_PURE_PYTHON")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True, timeout=120)


def test_every_extension_loads_when_required():
    if not native.require_c():
        pytest.skip("PACKYARD_REQUIRE_C=1 (the C extensions must be built) not set")
    assert native.missing() == []
    if not native.pure_python():
        for name in native.EXTENSIONS:
            assert getattr(native, name)() is not None, name


def test_require_c_names_the_extension_that_does_not_load():
    """An extension that does not import (sys.modules[name] = None: what import does for a module that is not
    there) fails its user's import under PACKYARD_REQUIRE_C=1, naming it; without, the Python runs."""
    if native.missing():
        pytest.skip(f"not every extension is built here: {native.missing()}")
    block = "import sys; sys.modules['packyard.store.maintenance.serving._bloom'] = None\n"
    proc = _python(block + "from packyard.store.maintenance.serving import bloom", PACKYARD_REQUIRE_C="1")
    assert proc.returncode != 0
    assert "MissingExtensionError" in proc.stderr and "packyard.store.maintenance.serving._bloom" in proc.stderr
    proc = _python(block + "from packyard.store.maintenance.serving import bitmap, bloom\n"
                   "from packyard.store.maintenance.walk import reach as walk\n"
                   "from packyard.store import native\n"
                   "assert bloom._c is None and bloom.open_packs(()) is None\n"
                   "assert walk.IMPLEMENTATION == bitmap.IMPLEMENTATION == 'c'\n"
                   "print(native.missing())")
    assert proc.returncode == 0, proc.stderr
    assert "packyard.store.maintenance.serving._bloom" in proc.stdout


def test_pure_python_selects_the_python_everywhere():
    code = ("from packyard.store import native\n"
            "from packyard.store.pack import delta\n"
            "from packyard.store.maintenance.serving import bitmap\n"
            "from packyard.store.maintenance.walk import reach as walk\n"
            "from packyard.store.fsck import rules\n"
            "assert all(getattr(native, n)() is None for n in native.EXTENSIONS)\n"
            "print(delta.IMPLEMENTATION, walk.IMPLEMENTATION, bitmap.IMPLEMENTATION, rules.IMPLEMENTATION)")
    proc = _python(code, PACKYARD_PURE_PYTHON="1")
    assert proc.returncode == 0, proc.stderr
    assert [w.lower() for w in proc.stdout.split()] == ["python"] * 4
    if not native.missing():   # built: REQUIRE_C checks the build, PURE_PYTHON still picks the Python
        proc = _python(code, PACKYARD_PURE_PYTHON="1", PACKYARD_REQUIRE_C="1")
        assert proc.returncode == 0, proc.stderr
        assert [w.lower() for w in proc.stdout.split()] == ["python"] * 4


def test_the_extensions_share_the_walks_packs_type():
    """_packwrite, _bitmap and _bloom take Packs from _walk's C API: anything else is refused by type."""
    if native.missing() or native.pure_python():
        pytest.skip("the C extensions are not built here (or PACKYARD_PURE_PYTHON=1)")
    packs = native.walk().Packs([], set(), 1)
    assert native.packwrite().find_reuse(packs, [b"\1" * 20]) is not None
    with pytest.raises(TypeError):
        native.packwrite().find_reuse(object(), [])
    with pytest.raises(TypeError):
        native.bitmap().bitmap_commits(object(), b"", lambda oid: None)
    with pytest.raises(TypeError):
        native.bloom().commit_reads(object(), b"", (), lambda oid: None)
    with pytest.raises(native.walk().WalkError):   # (one WalkError: the reads' errors are the walk's)
        native.bloom().commit_reads(packs, b"\1" * 20, (), lambda oid: (2, b""))
    packs.close()


def _sources() -> list[Path]:
    return [p for top in ("store", "workers") for p in sorted((ROOT / top).rglob("*.py"))]


def test_only_store_native_loads_the_extensions():
    """No module but store/native.py imports an extension, and none reaches another module's handle on one
    (``walk._c``, ``from .walk import _c``)."""
    names = {m.rsplit(".", 1)[1] for m in native.EXTENSIONS.values()}
    found = []
    for path in _sources():
        if path == ROOT / "store" / "native.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom):
                if (node.module or "").rsplit(".", 1)[-1] in names or any(a.name in names | {"_c"} for a in node.names):
                    found.append(where)
            elif isinstance(node, ast.Import):
                if any(a.name.rsplit(".", 1)[-1] in names for a in node.names):
                    found.append(where)
            elif isinstance(node, ast.Attribute) and node.attr == "_c" and isinstance(node.value, ast.Name):
                found.append(where)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in native.EXTENSIONS.values()):
                found.append(where)
    assert found == []


def _obj(kind: str, data: bytes) -> tuple[bytes, bytes]:
    import hashlib
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).digest(), data


@pytest.mark.parametrize("mode", [b"100644", b"10x644"])
def test_the_bitmap_closure_reads_tree_entries_as_the_walk_does(mode):
    """One tree-entry reader (_walk.h's tree_entry_next, walk/reach.py's _TREE_ENTRY) for the walk, the Bloom
    filters and the bitmap closures: an octal mode or a malformed entry, in C as in build_bitmaps."""
    from packyard.store.errors import CorruptObjectError
    from packyard.store.maintenance.serving import bitmap

    if native.bitmap() is None:
        pytest.skip("the C extensions are not built here (or PACKYARD_PURE_PYTHON=1)")
    blob, blob_data = _obj("blob", b"x\n")
    tree, tree_data = _obj("tree", mode + b" f\0" + blob)
    commit, commit_data = _obj("commit", b"tree " + tree.hex().encode() + b"\nauthor a <a> 1700000000 +0000\n"
                               b"committer a <a> 1700000000 +0000\n\nm\n")
    objects = {blob: (3, blob_data), tree: (2, tree_data), commit: (1, commit_data)}
    order = [commit, tree, blob]
    pos = {oid: k for k, oid in enumerate(order)}

    def graph(c):
        return (tree, [], 1700000000)

    packs = native.walk().Packs([], set(), 1)
    try:
        def c_closure():
            with bitmap._c_errors():
                return bitmap._c_build([commit], order, pos, graph, objects.__getitem__, packs)

        if mode == b"100644":
            words = c_closure()[0]
            assert int.from_bytes(words, "little") == bitmap.build_bitmaps([commit], pos, 3, graph,
                                                                           objects.__getitem__)[0] == 0b111
        else:
            with pytest.raises(CorruptObjectError):
                bitmap.build_bitmaps([commit], pos, 3, graph, objects.__getitem__)
            with pytest.raises(CorruptObjectError, match="does not parse"):
                c_closure()
    finally:
        packs.close()
