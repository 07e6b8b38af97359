"""The side-by-side table head the benches share (pool, receive, midx): the lines it printed before."""
from __future__ import annotations

from packyard.workers.cli.bench import common


def test_wall_and_rss_lines(capsys) -> None:  # type: ignore[no-untyped-def]
    common.print_wall_rss("clone", ([1.0, 3.0, 2.0], [1.0, 1.0, 1.0]), ([2**20, 3 * 2**20], [2**21, 2**20]))
    assert capsys.readouterr().out.splitlines() == [
        "clone:                          packyard        git   ratio",
        "clone: wall time (median) s        2.000      1.000   2.00x",
        "clone: peak RSS (max) MiB            3.0        2.0   1.50x",
    ]


def test_labels_and_width(capsys) -> None:  # type: ignore[no-untyped-def]
    common.print_wall_rss("ten", ([0.5], [0.25]), ([2**20], [2**20]), wall_label="push wall (median) s",
                          rss_label="server peak RSS MiB", width=24)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "ten: push wall (median) s          0.500      0.250   2.00x"
    assert out[2] == "ten: server peak RSS MiB             1.0        1.0   1.00x"
