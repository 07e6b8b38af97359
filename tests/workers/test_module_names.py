"""No packyard module is named like a standard-library module (workers/logging.py was, and imported ``logging``)."""
from __future__ import annotations

import sys

from gitutil import ROOT

#: Named for the task they serve (``packyard.gc``: workers/tasks/<task>.py, workers/commands/<task>.py and the
#: CLI's ``packyard gc``); none of them imports the standard library's ``gc``.
ALLOWED = {"gc"}


def _module_names() -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for top in ("store", "workers"):
        for path in (ROOT / top).rglob("*"):
            if "__pycache__" in path.parts:
                continue
            if path.suffix == ".py" and path.stem != "__init__":
                names.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
            elif path.is_dir() and (path / "__init__.py").exists():
                names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    return names


def test_no_module_shadows_the_standard_library():
    shadowing = {name: paths for name, paths in _module_names().items()
                 if name in sys.stdlib_module_names and name not in ALLOWED}
    assert shadowing == {}


def test_the_allowed_names_do_not_import_what_they_shadow():
    for name in ALLOWED:
        for path in _module_names().get(name, []):
            text = (ROOT / path).read_text()
            assert f"import {name}\n" not in text and f"from {name} import" not in text, path
