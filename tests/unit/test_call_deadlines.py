"""CallDeadlines on a real asyncio loop: a deadline that passes runs its expire callback, a
discarded one never does, an earlier deadline re-arms the one timer, and many deadlines in a row
keep one timer on the loop (not one each)."""

from __future__ import annotations

import asyncio

from meshd.client.call_deadlines import CallDeadlines


def _timers(loop: asyncio.AbstractEventLoop) -> int:
    """Timers on the loop's heap that are not cancelled (asyncio's own bookkeeping)."""
    return sum(1 for handle in loop._scheduled if not handle.cancelled())  # type: ignore[attr-defined]


def test_a_passed_deadline_expires_and_a_discarded_one_does_not() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        deadlines = CallDeadlines()
        expired: list[str] = []
        done = asyncio.Event()

        def expire(key: str) -> None:
            expired.append(key)
            if key == "late":
                done.set()

        deadlines.add(loop, "answered", 0.01, expire, "answered")
        deadlines.add(loop, "late", 0.02, expire, "late")
        deadlines.discard("answered")
        await asyncio.wait_for(done.wait(), 5)
        assert expired == ["late"]
        assert len(deadlines) == 0

    asyncio.run(scenario())


def test_an_earlier_deadline_rearms_the_timer() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        deadlines = CallDeadlines()
        expired: list[str] = []
        first = asyncio.Event()
        deadlines.add(loop, "long", 60.0, expired.append, "long")
        deadlines.add(loop, "short", 0.01, lambda key: (expired.append(key), first.set()), "short")
        await asyncio.wait_for(first.wait(), 5)
        assert expired == ["short"]
        assert len(deadlines) == 1  # "long" still waits, on the re-armed timer
        assert _timers(loop) == 1
        deadlines.discard("long")

    asyncio.run(scenario())


def test_many_deadlines_keep_one_timer() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        before = _timers(loop)
        deadlines = CallDeadlines()
        for n in range(1000):
            deadlines.add(loop, f"r{n}", 30.0, lambda: None)
            deadlines.discard(f"r{n}")
        assert _timers(loop) - before == 1
        assert len(deadlines) == 0

    asyncio.run(scenario())
