"""packyard down: stop the embedded Redis that worker / beat / flower / submit left running.

The embedded server keeps its data in an append-only file under the state dir: queued and
delivered jobs survive a stop and run when it starts again. Stopping it still cuts off the
workers, beat and flower connected to it and stalls the jobs in flight, so it is stopped only
when nothing still uses it -- no other client connected, no message queued or
delivered-but-unacknowledged, no lease held -- unless ``--force``; otherwise the command says
what is still there and exits 1.
An external Redis (PACKYARD_REDIS_URL) is never touched.
"""
from __future__ import annotations

import argparse
import sys

from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "down", help="stop the embedded Redis left running under the state dir",
        description="Stop the embedded Redis under PACKYARD_STATE_DIR once nothing uses it: no other client "
                    "(worker, beat, flower), no queued or unacknowledged job, no repository lease. Its data is "
                    "kept (append-only file): with --force, queued jobs wait for the next start.")
    p.add_argument("--force", action="store_true",
                   help="stop it even though clients, jobs or leases remain (jobs are kept for the next start)")
    p.set_defaults(func=run, logs=False)   # runs in this process and prints its result; no log lines


def still_in_use(client) -> list[str]:  # type: ignore[no-untyped-def]
    """What would be lost or cut off by stopping the server, one line each (empty: nothing)."""
    from packyard.workers.locks import KEY_PREFIX

    me = client.client_id()
    others = [c for c in client.client_list() if int(c["id"]) != me]
    found = [f"{len(others)} other client(s) connected (workers, beat, flower, …)"] if others else []
    queued = 0
    for key in client.scan_iter(count=1000):
        if client.type(key) == b"list":
            queued += client.llen(key)
    if queued:
        found.append(f"{queued} queued job message(s)")
    unacked = client.hlen("unacked")
    if unacked:
        found.append(f"{unacked} job(s) delivered to a worker and not acknowledged")
    leases = sum(1 for _ in client.scan_iter(match=KEY_PREFIX + "*", count=1000))
    if leases:
        found.append(f"{leases} repository lease(s) held")
    return found


def run(args: argparse.Namespace) -> int:
    from packyard.workers.embedded import EmbeddedRedis

    settings = get_settings()
    if not settings.embedded_redis:
        print("packyard down: Redis is external (PACKYARD_REDIS_URL); nothing to stop")
        return 0
    server = EmbeddedRedis.for_settings(settings)
    if not server.ping():
        print(f"packyard down: no embedded Redis running under {server.dir}")
        return 0
    with server.client(socket_timeout=5.0) as client:
        in_use = still_in_use(client)
    if in_use and not args.force:
        print(f"packyard down: the embedded Redis under {server.dir} is still in use:", file=sys.stderr)
        for line in in_use:
            print(f"  {line}", file=sys.stderr)
        print("stop the workers first, or use --force (queued jobs are kept for the next start)", file=sys.stderr)
        return 1
    pid = server.pid_from_file()
    server.stop(force=True)
    if server.ping():
        print(f"packyard down: the embedded Redis under {server.dir} is still answering", file=sys.stderr)
        return 1
    dropped = f" (still there for the next start: {'; '.join(in_use)})" if in_use else ""
    print(f"packyard down: stopped the embedded Redis (pid {pid}) under {server.dir}{dropped}")
    return 0
