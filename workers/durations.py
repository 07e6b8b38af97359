"""The one duration parser: how long, in seconds, from what a person or git writes.

:func:`parse_duration` reads

* git's spellings of an age (its approxidate, as ``--expire``/``gc.pruneExpire`` take it): ``2.weeks.ago``,
  ``1.hour.ago``, ``3 days ago``, ``now`` (0) and ``never`` (infinity); a month is 30 days, a year 365;
* short spans: ``250us``, ``1ms``, ``90s``, ``30m`` (minutes), ``12h``, ``1d``, ``2w``, with a fraction allowed
  (``1.5h``, ``0.002s``);
* plain seconds (``90``, ``1.5``) unless the caller says a bare number means something else.

Anything else, or a negative number, is an :class:`InvalidInputError` naming the text. Callers: ``repack``'s
expiry (workers/commands/repack.py ``parse_expire``), ``packyard races --since``
(workers/cli/races.py ``parse_since``) and nfsim's metadata latency (``--nfsim-latency 1ms``).
"""
from __future__ import annotations

import re

from packyard.store.errors import InvalidInputError

#: Seconds per unit, by every name a unit is written with.
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1, "second": 1, "m": 60, "minute": 60, "h": 3600, "hour": 3600,
         "d": 86400, "day": 86400, "w": 7 * 86400, "week": 7 * 86400, "month": 30 * 86400, "year": 365 * 86400}
_AGO = re.compile(r"^(\d+)[. ]?(second|minute|hour|day|week|month|year)s?[. ]ago$")
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*(us|ms|s|m|h|d|w)$")


def parse_duration(text: str, *, bare_seconds: bool = True) -> float:
    """Seconds in ``text`` (see the module docstring); ``bare_seconds=False`` refuses a plain number."""
    spelled = text.strip().lower()
    if spelled == "now":
        return 0.0
    if spelled == "never":
        return float("inf")
    m = _AGO.match(spelled) or _SPAN.match(spelled)
    if m:
        return float(m.group(1)) * UNITS[m.group(2)]
    if bare_seconds:
        try:
            seconds = float(spelled)
        except ValueError:
            pass
        else:
            if seconds < 0 or seconds != seconds:
                raise InvalidInputError(f"a duration must not be negative: {text!r}")
            return seconds
    raise InvalidInputError(f"cannot read the duration {text!r}: want e.g. 2.weeks.ago, 12h, now, never"
                            + (" or seconds" if bare_seconds else ""))
