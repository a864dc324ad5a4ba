"""LogOnce (bounded, repeat-suppressing) and backoff_delay (capped exponential with jitter)."""

import logging
import random

import pytest

from meshd.util.backoff import backoff_delay
from meshd.util.logonce import LogOnce


def test_log_once_suppresses_repeats_and_forgets(caplog: pytest.LogCaptureFixture) -> None:
    quiet = LogOnce(logging.getLogger("t.logonce"), capacity=2)
    with caplog.at_level(logging.WARNING, "t.logonce"):
        assert quiet.log("a", "first %s", 1)
        assert not quiet.log("a", "first %s", 2)
        quiet.forget("a")
        assert quiet.log("a", "again")
    assert [r.getMessage() for r in caplog.records] == ["first 1", "again"]
    assert quiet.suppressed == 1


def test_log_once_is_bounded() -> None:
    quiet = LogOnce(logging.getLogger("t.logonce2"), capacity=3)
    for i in range(100):
        quiet.log(f"peer-{i}", "bad peer")
    assert len(quiet._seen) == 3
    assert "peer-99" in quiet and "peer-0" not in quiet


def test_backoff_without_jitter_doubles_to_the_cap() -> None:
    got = [backoff_delay(n, 0.5, 5.0, jitter=0) for n in range(1, 7)]
    assert got == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff_delay(10_000, 1.0, 30.0, jitter=0) == 30.0


def test_backoff_jitter_stays_in_range_and_varies() -> None:
    rng = random.Random(7)
    got = [backoff_delay(3, 1.0, 30.0, jitter=0.5, rng=rng) for _ in range(200)]
    assert all(2.0 <= d <= 4.0 for d in got)
    assert len({round(d, 6) for d in got}) > 100
