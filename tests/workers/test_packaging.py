"""Packaging: the checkout's store/, workers/, migrations/ install as packyard.store, packyard.workers,
packyard.migrations, and no code imports them under their bare (generic) names."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from gitutil import ROOT

TOP = {"store", "workers", "migrations"}
BARE_IMPORT = re.compile(r"(?m)^\s*(?:from|import)\s+(store|workers|migrations)\b|\\n(?:from|import) (store|workers)\b")


def _declared() -> tuple[set[str], dict[str, str]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(cfg["packages"]), cfg["package-dir"]


def test_every_package_directory_is_declared_under_the_packyard_namespace():
    packages, dirs = _declared()
    assert dirs == {f"packyard.{t}": t for t in TOP}
    on_disk = {"packyard." + ".".join(p.parent.relative_to(ROOT).parts)
               for t in TOP for p in (ROOT / t).rglob("__init__.py") if ".venv" not in p.parts}
    on_disk.add("packyard.migrations.versions")   # Alembic's revision files: a directory without __init__
    assert packages == on_disk, f"pyproject.toml packages differ from the tree: {packages ^ on_disk}"


def test_no_module_is_imported_by_its_bare_name():
    offenders = []
    for path in [*ROOT.glob("store/**/*.py"), *ROOT.glob("workers/**/*.py"), *ROOT.glob("migrations/**/*.py"),
                 *ROOT.glob("tests/**/*.py")]:
        for m in BARE_IMPORT.finditer(path.read_text()):
            offenders.append(f"{path.relative_to(ROOT)}: {m.group(0).strip()}")
    assert not offenders, "import these through the packyard namespace:\n" + "\n".join(offenders)


def test_installed_modules_come_from_the_checkout_folders():
    import packyard.migrations
    import packyard.store
    import packyard.workers

    for mod, top in ((packyard.store, "store"), (packyard.workers, "workers"), (packyard.migrations, "migrations")):
        assert Path(mod.__file__).resolve().parent.name == top
