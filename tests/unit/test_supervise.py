"""supervised(): a background loop that raises is logged, counted and restarted (one bad message
must not stop it for good)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from meshd.util.logonce import LogOnce
from meshd.util.supervise import supervised


def test_a_raising_loop_is_restarted_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    stats: Counter[str] = Counter()
    runs: list[int] = []

    async def loop() -> None:
        runs.append(1)
        if len(runs) <= 3:
            raise TypeError("unhashable type: 'dict'")  # one bad message, three times

    with caplog.at_level(logging.WARNING):
        asyncio.run(supervised(loop, "meshd-qos1", stats, LogOnce(logging.getLogger("t"))))
    assert len(runs) == 4  # restarted until it returned
    assert stats["task_restarts_meshd-qos1"] == 3
    assert sum("background task meshd-qos1 raised" in r.message for r in caplog.records) == 1


def test_cancelling_a_supervised_loop_stops_it() -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def scenario() -> None:
        task = asyncio.ensure_future(supervised(forever, "t", Counter(), LogOnce(logging.getLogger("t"))))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
