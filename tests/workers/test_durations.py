"""The one duration parser (workers/durations.py) and its callers, as tables."""
from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from packyard.store.errors import InvalidInputError
from packyard.workers.cli.races import parse_since
from packyard.workers.commands.repack import parse_expire
from packyard.workers.durations import parse_duration

DAY = 86400


@pytest.mark.parametrize(("text", "seconds"), [
    # git's spellings of an age (approxidate)
    ("2.weeks.ago", 14 * DAY), ("1.hour.ago", 3600), ("3.days.ago", 3 * DAY), ("1.day.ago", DAY),
    ("10.minutes.ago", 600), ("45.seconds.ago", 45), ("2.months.ago", 60 * DAY), ("1.year.ago", 365 * DAY),
    ("3 days ago", 3 * DAY), ("1 week ago", 7 * DAY), ("  2.Weeks.Ago ", 14 * DAY),
    ("now", 0), ("NOW", 0), ("never", float("inf")),
    # short spans
    ("250us", 250e-6), ("1ms", 1e-3), ("0.002s", 0.002), ("90s", 90), ("30m", 1800), ("12h", 12 * 3600),
    ("1d", DAY), ("2w", 14 * DAY), ("1.5h", 5400), ("2 d", 2 * DAY),
    # plain seconds
    ("90", 90), ("0", 0), ("1.5", 1.5),
])
def test_parse_duration_reads(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "yesterday", "2.fortnights.ago", "1.5.hours.ago", "-5", "nan", "12x", "h",
                                  "2 weeks", "1mo", "-1ms", "ms"])
def test_parse_duration_refuses_naming_the_text(text):
    with pytest.raises(InvalidInputError, match="duration"):
        parse_duration(text)


def test_a_bare_number_is_refused_when_the_caller_says_so():
    with pytest.raises(InvalidInputError, match="'90'"):
        parse_duration("90", bare_seconds=False)
    assert parse_duration("90s", bare_seconds=False) == 90


@pytest.mark.parametrize(("value", "seconds"), [
    (None, 14 * DAY), ("", 14 * DAY), (90, 90), (2.5, 2.5), ("2.weeks.ago", 14 * DAY), ("never", float("inf")),
    ("1d", DAY),
])
def test_parse_expire_over_the_parser(value, seconds):
    assert parse_expire(value) == seconds


@pytest.mark.parametrize("value", [-1, "-1", "soon"])
def test_parse_expire_refuses(value):
    with pytest.raises(InvalidInputError, match="expiry"):
        parse_expire(value)


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "when"), [
    ("1d", NOW - timedelta(days=1)), ("90s", NOW - timedelta(seconds=90)), ("2w", NOW - timedelta(weeks=2)),
    ("3.days.ago", NOW - timedelta(days=3)), ("now", NOW),
    ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)), ("20261130", datetime(2026, 11, 30, tzinfo=UTC)),
    ("2026-11-30T12:00+01:00", datetime(2026, 11, 30, 11, 0, tzinfo=UTC)),
])
def test_parse_since(text, when):
    assert parse_since(text, now=NOW) == when


@pytest.mark.parametrize("text", ["never", "yesterday", "90"])
def test_parse_since_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--since"):
        parse_since(text, now=NOW)
