"""`packyard bench repack` warms each run's input, untimed, right before the run (workers/cli/bench/repack.py)."""
from __future__ import annotations

import os

from packyard.workers.cli.bench.repack import warm


def test_warm_reads_every_file_of_the_repository_once_and_follows_no_link(tmp_path):
    repo = tmp_path / "r.git"
    (repo / "objects" / "pack").mkdir(parents=True)
    (repo / "objects" / "ab").mkdir()
    files = {repo / "HEAD": b"ref: refs/heads/main\n", repo / "objects" / "ab" / "cd": os.urandom(3000),
             repo / "objects" / "pack" / "pack-1.pack": os.urandom((1 << 20) + 17),
             repo / "objects" / "pack" / "empty": b""}
    for path, data in files.items():
        path.write_bytes(data)
    outside = tmp_path / "outside"
    outside.write_bytes(b"x" * 5000)
    (repo / "objects" / "pack" / "link").symlink_to(outside)
    assert warm(repo) == sum(len(d) for d in files.values())
