"""The CLI's progress bars: one tqdm bar per phase of a ``Progress`` callback, on a terminal only."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Mapping


def terminal_size(stream: Any, fallback: tuple[int, int] = (100, 24)) -> tuple[int, int]:
    """(columns, rows) of the terminal behind ``stream``; a terminal reporting 0 (a fresh pty) gets the fallback.

    tqdm hides every bar when it is told (or finds out by itself) that the screen has 0 rows,
    so both numbers are always passed to it, never left for tqdm to discover.
    """
    try:
        size = os.get_terminal_size(stream.fileno())
        columns, rows = size.columns, size.lines
    except (AttributeError, ValueError, OSError):
        columns, rows = 0, 0
    return columns or fallback[0], rows or fallback[1]


class TqdmProgress:
    """The CLI's one progress adapter: a ``progress(phase, done, total)`` callable driving one tqdm bar per phase.

    ``labels`` maps phase names to what the bar says (index-pack uses git's "Receiving objects" wording).
    """

    BAR_FORMAT = "{desc}: {percentage:3.0f}% ({n_fmt}/{total_fmt}) {bar} [{elapsed}, {rate_fmt}]"
    #: Phases that count bytes rather than objects (import_tree streaming a large file).
    BYTE_PHASES = frozenset({"hash", "compress"})
    BAR_FORMAT_NO_TOTAL = "{desc}: {n_fmt} [{elapsed}, {rate_fmt}]"

    def __init__(self, stream: Any = None, labels: Mapping[str, str] | None = None, unit: str = " obj") -> None:
        self.stream = stream or sys.stderr
        self.labels = dict(labels or {})
        self.unit = unit
        self.bar: Any = None
        self.phase: str | None = None

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase = phase
            columns, rows = terminal_size(self.stream)
            in_bytes = phase in self.BYTE_PHASES
            self.bar = tqdm(total=total, desc=self.labels.get(phase, phase), file=self.stream,
                            unit="B" if in_bytes else self.unit, unit_scale=in_bytes, unit_divisor=1024,
                            leave=True, ncols=columns, nrows=rows, mininterval=0.2,
                            bar_format=self.BAR_FORMAT if total is not None else self.BAR_FORMAT_NO_TOTAL)
        if total is not None and self.bar.total != total:
            self.bar.total = total
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def make_progress(args: argparse.Namespace, labels: Mapping[str, str] | None = None) -> TqdmProgress | None:
    """A progress adapter when stderr is a terminal and ``--no-progress`` was not given, else None."""
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        return None
    return TqdmProgress(labels=labels)
