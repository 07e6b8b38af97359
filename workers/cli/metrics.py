"""packyard metrics --port P: a Prometheus endpoint reading the records database on each scrape."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "metrics", help="serve Prometheus metrics from the job records",
        description="Serve /metrics for Prometheus: jobs by kind and state, job durations (histograms), lease "
                    "events, race events, maintenance jobs in flight, repositories due for maintenance, distributions "
                    "of packs, loose objects and days since the last full repack over the enabled repositories, "
                    "and the top N repositories of each. Read from PACKYARD_DATABASE_URL at scrape time, from "
                    "counters and recorded statistics: the cost does not grow with history (workers/metrics.py).")
    p.add_argument("--port", type=int, default=9108, help="TCP port (default 9108)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in a "
                                                           "container)")
    p.add_argument("--top", type=int, default=None, metavar="N",
                   help="repositories per per-repository family (default: PACKYARD_METRICS_TOP_REPOS, 10)")
    p.add_argument("--once", action="store_true", help="print one scrape to stdout and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import generate_latest, start_http_server

    from packyard.workers.metrics import make_registry

    s = get_settings()
    registry = make_registry(s, top=args.top)
    if args.once:
        sys.stdout.write(generate_latest(registry).decode())
        return 0
    server, thread = start_http_server(args.port, addr=args.address, registry=registry)
    print(f"packyard metrics: serving http://{args.address}:{args.port}/metrics from {s.database_url}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0
