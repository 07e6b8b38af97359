"""nfsim: several simulated NFS client hosts over one backing directory, for tests and benchmarks.

``Mount(backing, mountpoint, ...)`` starts ``packyard nfsim mount`` as a child process (one FUSE
mount = one host: its own attribute and directory-listing caches, ESTALE, latency per metadata
call, counters); :func:`unavailable` says why nfsim cannot run here (None when it can). The
filesystem is :mod:`packyard.workers.nfsim.fs` (the specification, on mfusepy) and its C twin
``_nfsimd.c`` (loaded through ``store/native.py``; :func:`implementation` picks); docs/nfs.md says what
it models and why.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SYNC_NAME = ".nfsim-sync"
MOUNT_WAIT_S = 20.0


IMPLEMENTATIONS = ("auto", "c", "python")


def implementation(impl: str = "auto") -> str:
    """``"c"`` or ``"python"``: the filesystem that serves a mount. ``auto``: the C one when it is built (and
    PACKYARD_PURE_PYTHON is not set), else fs.py. Asking for ``c`` where it is not built is a ValueError."""
    from packyard.store import native

    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"nfsim implementation must be one of {IMPLEMENTATIONS}, not {impl!r}")
    built = native.nfsim() is not None
    if impl == "c" and not built:
        raise ValueError("nfsim's C filesystem is not built here (needs libfuse3's headers at install: "
                         "Debian's libfuse3-dev)")
    return "python" if impl == "python" or not built else "c"


def unavailable(impl: str = "auto") -> str | None:
    """Why nfsim cannot mount here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian: apt-get install fuse3)"
    try:
        if implementation(impl) == "c":
            return None
    except ValueError as err:
        return str(err)
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as err:
        return f"the mfusepy binding or libfuse3 cannot be loaded: {err}"
    return None


def _mount_dev(path: Path) -> int:
    return os.stat(path).st_dev


class Mount:
    """One simulated host's mount of ``backing`` at ``mountpoint`` (a child process until :meth:`close`)."""

    def __init__(self, backing: Path, mountpoint: Path, *, ac_attr: float = 3.0, ac_dir: float = 3.0,
                 latency: float = 0.001, dir_revalidate: str = "open", counters: Path | None = None,
                 name: str = "nfsim", trace: Path | None = None, impl: str = "auto") -> None:
        self.backing, self.mountpoint = Path(backing), Path(mountpoint)
        self.impl = implementation(impl)
        self.counters_path = counters or self.mountpoint.with_name(self.mountpoint.name + ".counters.json")
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        before = _mount_dev(self.mountpoint)
        cmd = [sys.executable, "-c", "import sys; from packyard.workers.cli import main; sys.exit(main(sys.argv[1:]))",
               "nfsim", "mount", str(self.backing),
               str(self.mountpoint), "--ac-attr", str(ac_attr), "--ac-dir", str(ac_dir),
               "--latency", f"{latency}s", "--dir-revalidate", dir_revalidate,
               "--counters", str(self.counters_path), "--name", name, "--impl", self.impl,
               *(["--trace", str(trace)] if trace else [])]
        # The daemon's messages go to a file, never a pipe nobody reads (a full pipe would stall the mount).
        self.log_path = self.mountpoint.with_name(self.mountpoint.name + ".log")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + MOUNT_WAIT_S
        while _mount_dev(self.mountpoint) == before:
            if self.proc.poll() is not None:
                err = self.log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"nfsim mount of {backing} at {mountpoint} exited {self.proc.returncode}: {err}")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"nfsim mount at {mountpoint} did not appear within {MOUNT_WAIT_S:.0f} s")
            time.sleep(0.02)

    def counters(self) -> dict[str, Any]:
        """The mount's counters as of now (asks the daemon to write them, then reads the file)."""
        try:
            os.stat(self.mountpoint / SYNC_NAME)
        except FileNotFoundError:
            pass
        return json.loads(self.counters_path.read_text())

    def cpu_seconds(self) -> float:
        """CPU time the mount's daemon has used so far (user + system, all its threads; /proc): the simulator's
        own work, which competes with the workload for this machine's cores. 0.0 once it has exited."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "Mount":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    """Counters of what happened between two readings (kinds with 0 left out)."""
    out = {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}
    return {k: v for k, v in out.items() if v}
