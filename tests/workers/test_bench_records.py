"""The records benchmark at 100k job rows, as CI runs it (the 1M/10M figures are in docs/records.md).

Timings are not asserted (the machine is shared): the test checks that the benchmark fills the database,
that its counters add up to the rows, that every query it times ran, that a scrape stays under 2,000
series and that prune removed the rows past the retention.
"""
from __future__ import annotations

import json
import subprocess

import pytest


@pytest.mark.slow
def test_bench_records_100k(pk):
    env = pk.cli_env()
    env.pop("PACKYARD_BENCH_POSTGRES_URL", None)   # SQLite here; PostgreSQL runs are by hand (docs/records.md)
    out = subprocess.run(["nice", "packyard", "bench", "records", "--jobs", "100000", "--repos", "2000",
                          "--runs", "1", "--sample", "20", "--compare-jobs", "20000", "--json"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["database"] == "sqlite" and r["jobs"] == 100_000 and r["repos"] == 2000
    assert r["counters equal rows"] is True
    assert set(r["timings s"]) >= {"status", "status --repo", "races", "races --repo", "reconciler pending rows",
                                   "janitor job lookup", "planner due list (window open 1h)", "record started",
                                   "record finished", "scrape"}
    assert 100 < r["scrape series"] <= 2000
    # 40 days of history, 30 kept: about a quarter of the jobs go (not the newest of a repository and kind);
    # 7 days of lock events kept: most of them go.
    assert 20_000 < r["prune"]["jobs_removed"] < 26_000
    assert r["prune"]["lock_events_removed"] > 150_000 and r["prune"]["more"] == ""
    # The window's real paged pass planned every due repository in a few transactions per page.
    pp = r["planner pass (paged sweep)"]
    assert pp["planned"] == pp["due"] > 1500
    assert pp["transactions"] <= 4 * (pp["due"] // pp["page"] + 2) + 3, pp
    # The same-load comparison scraped both databases in alternating rounds.
    cmp_ = r["same-load scrape"]
    assert cmp_["jobs"] == {"big": 100_000, "small": 20_000} and cmp_["rounds"] >= 3
    assert all(100 < n <= 2000 for n in cmp_["series"].values())
