"""The benchmarks' ``--nfsim-latency``: a list of latencies, and the table over the mount with no latency.

What a mount adds is two things on this machine: the simulator's own work (every page through a user-space
daemon on the same cores) and the round trips. ``--nfsim-latency 0ms,1ms`` runs both sides on a mount per
latency in one run; with 0 among them, the last table divides each side's time at the other latencies by
its time at 0 (docs/nfs.md, "Where the goals stand"). No mount here: the parsing and the arithmetic.
"""
from __future__ import annotations

import argparse

import pytest

from packyard.workers.cli.bench import nfsim_side


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    nfsim_side.add_arg(p)
    return p


@pytest.mark.parametrize("given, latencies", [
    ("1ms", ["1ms"]),
    ("0ms,1ms", ["0ms", "1ms"]),
    (" 250us , 1ms ,", ["250us", "1ms"]),
])
def test_the_latencies_come_in_the_order_given(given, latencies):
    assert _parser().parse_args(["--nfsim-latency", given]).nfsim_latency == latencies


@pytest.mark.parametrize("given", ["", ",", "fast", "1ms,soon", "never"])
def test_a_latency_that_is_no_duration_is_refused_by_the_parser(given, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--nfsim-latency", given])
    assert e.value.code == 2
    assert "--nfsim-latency" in capsys.readouterr().err


def test_without_the_option_no_mount_runs():
    assert _parser().parse_args([]).nfsim_latency is None


def test_each_latency_gets_its_own_directories():
    assert nfsim_side.slug("1ms") == "1ms" and nfsim_side.slug("0.5ms") == "0_5ms"
    assert len({nfsim_side.slug(t) for t in ("0ms", "250us", "1ms", "0.5ms")}) == 4


def test_each_side_over_its_own_time_on_the_mount_with_no_latency(capsys):
    walls = {"0ms": {"packyard": [0.60, 0.64, 0.70], "git": [0.88, 0.90, 0.86]},
             "1ms": {"packyard": [0.94, 0.96, 0.90], "git": [2.48, 2.50, 2.40]},
             "250us": {"packyard": [0.80], "git": [1.32]}}
    nfsim_side.report_over_floor(walls)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "over the mount with no latency (0ms): the round trips' own cost"
    # medians: packyard 0.64 at 0, 0.94 at 1 ms; git 0.88 at 0, 2.48 at 1 ms
    assert out[2] == f"  at 1ms: packyard {0.94 / 0.64:.2f}x, git {2.48 / 0.88:.2f}x"
    assert out[3] == f"  at 250us: packyard {0.80 / 0.64:.2f}x, git {1.32 / 0.88:.2f}x"


@pytest.mark.parametrize("walls", [
    {"1ms": {"packyard": [1.0]}},                              # one latency: the per-latency table says it all
    {"1ms": {"packyard": [1.0]}, "2ms": {"packyard": [1.5]}},  # no mount without latency to divide by
    {"0ms": {"packyard": [1.0]}},
])
def test_nothing_over_the_floor_without_a_floor_and_another_latency(walls, capsys):
    nfsim_side.report_over_floor(walls, "full: ")   # (not even the title: no heading left hanging)
    assert capsys.readouterr().out == ""


def test_the_title_heads_the_table_over_the_floor(capsys):
    nfsim_side.report_over_floor({"0ms": {"git": [1.0]}, "1ms": {"git": [2.0]}}, "geometric: ")
    assert capsys.readouterr().out.splitlines()[1:] == [
        "geometric: over the mount with no latency (0ms): the round trips' own cost", "  at 1ms: git 2.00x"]
