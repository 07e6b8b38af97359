"""packyard bench: benchmarks side by side with git, reported as ratios.

Each benchmark is a module here with ``register(subparsers)`` (like a CLI command);
list it in BENCHMARKS. Helpers: :mod:`packyard.workers.cli.bench.common`.
"""
from __future__ import annotations

import importlib

BENCHMARKS = ("verify", "loose", "index_pack", "delta", "repack", "serve", "graph", "midx", "records", "pool", "status",
              "receive", "backup")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("bench", help="benchmarks against git (ratios)",
                              description="Run a benchmark side by side with git; results are ratios.")
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    sub.required = True
    for name in BENCHMARKS:
        importlib.import_module(f"packyard.workers.cli.bench.{name}").register(sub)
