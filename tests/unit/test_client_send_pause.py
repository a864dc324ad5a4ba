"""The client's per-destination send pause (meshd/client/send_pause.py), on a real event loop, no sockets:
a refusal pauses the sends to that destination only, waiters resume in order, the pause grows
while refusals continue and starts small again after a quiet spell, and the table is bounded."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from meshd.client.send_pause import (
    SEND_PAUSE_DESTINATIONS,
    SEND_PAUSE_IDS,
    SEND_PAUSE_MIN,
    SEND_YIELD_EVERY,
    SendPauses,
)


def _sent(pauses: SendPauses, *pairs: tuple[str, str]) -> None:
    """Tell ``pauses`` of qos-0 sends (message id, destination), as ``Agent.send`` does."""
    for msg_id, to in pairs:
        pauses.sent(msg_id, to)


def test_a_refusal_pauses_that_destination_only_and_waiters_resume_in_order() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        pauses = SendPauses()
        _sent(pauses, ("m1", "slow"), ("m2", "slow"))
        pauses.refused(["m1", "m2", "unknown"], None, loop)
        assert pauses.active == 1 and pauses.started == 1, "one pause for a refused batch"
        assert pauses.paused("slow") and not pauses.paused("fast")
        await asyncio.wait_for(pauses.wait("fast"), 1)  # another destination does not wait
        assert pauses.paused("slow"), "a send elsewhere returned before the pause ended"
        order: list[int] = []

        async def sender(i: int) -> None:
            await pauses.wait("slow")
            order.append(i)
        await asyncio.wait_for(asyncio.gather(*(sender(i) for i in range(20))), 5)
        assert order == list(range(20)), "the paused sends go on in the order they came"
        assert pauses.active == 0 and not pauses.paused("slow")
        assert pauses.pauses_of("slow") == 1 and pauses.pauses_of("fast") == 0

    asyncio.run(scenario())


class _StepClock:
    """The two loop methods a pause uses, on a clock the test moves: "refused again as soon as the
    pause ends" is exact here, where a busy machine's real loop wakes milliseconds late (and a
    wake 2 pause lengths late is, rightly, a quiet spell that starts the pause small again)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Any, tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any) -> None:
        self.timers.append((when, callback, args))

    def run_next_timer(self) -> None:
        self.timers.sort(key=lambda t: t[0])
        when, callback, args = self.timers.pop(0)
        self.now = when
        callback(*args)


def test_the_pause_grows_while_refusals_continue_and_is_capped_by_retry_after() -> None:
    clock = _StepClock()
    loop = cast(asyncio.AbstractEventLoop, clock)
    pauses = SendPauses()
    _sent(pauses, ("m", "slow"))
    lengths = []
    for _ in range(8):
        pauses.refused(["m"], 0.01, loop)
        pauses.refused(["m"], 0.01, loop)  # while paused: the same pause
        lengths.append(pauses._by_dest["slow"].length)
        assert pauses.paused("slow")
        clock.run_next_timer()  # the pause ends; refused again at once
        assert not pauses.paused("slow")
    assert lengths[0] == SEND_PAUSE_MIN
    assert lengths == sorted(lengths) and lengths[-1] == 0.01, "doubling, at most retry_after"
    assert lengths[1] == 2 * SEND_PAUSE_MIN
    assert pauses.started == 8
    clock.now += 1.0  # a quiet spell: the next refusal starts small again
    pauses.refused(["m"], 0.01, loop)
    assert pauses._by_dest["slow"].length == SEND_PAUSE_MIN


def test_the_pause_starts_small_again_after_a_quiet_spell() -> None:
    clock = _StepClock()
    loop = cast(asyncio.AbstractEventLoop, clock)
    pauses = SendPauses()
    _sent(pauses, ("m", "slow"))
    for _ in range(3):
        pauses.refused(["m"], None, loop)
        clock.run_next_timer()  # the pause ends; refused again at once
    assert pauses._by_dest["slow"].length == SEND_PAUSE_MIN * 4
    clock.now += 1.0  # the last pause ended a second ago
    pauses.refused(["m"], None, loop)
    assert pauses._by_dest["slow"].length == SEND_PAUSE_MIN


def test_the_destinations_remembered_are_bounded_and_clear_opens_every_gate() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        pauses = SendPauses()
        n = SEND_PAUSE_DESTINATIONS + 10
        _sent(pauses, *((f"m{i}", f"dest{i}") for i in range(n)))
        pauses.refused([f"m{i}" for i in range(n)], None, loop)
        assert len(pauses._by_dest) == SEND_PAUSE_DESTINATIONS, "all paused: no room for more"
        assert not pauses.paused(f"dest{n - 1}")
        waiter = asyncio.ensure_future(pauses.wait("dest0"))
        await asyncio.sleep(0)
        pauses.clear()
        await asyncio.wait_for(waiter, 1)
        assert pauses.active == 0 and not pauses.paused("dest0") and pauses.pauses_of("dest0") == 1
        assert not pauses._sent, "the ids sent are forgotten"
        pauses._by_dest.clear()
        _sent(pauses, *((f"m{i}", f"dest{i}") for i in range(n)))
        pauses.refused([f"m{i}" for i in range(SEND_PAUSE_DESTINATIONS)], None, loop)
        await asyncio.wait_for(asyncio.gather(*(pauses.wait(f"dest{i}")
                                                for i in range(SEND_PAUSE_DESTINATIONS))), 5)
        assert pauses.active == 0 and len(pauses._by_dest) == SEND_PAUSE_DESTINATIONS
        pauses.refused([f"m{n - 1}"], None, loop)  # idle ones are forgotten to make room
        assert pauses.paused(f"dest{n - 1}") and len(pauses._by_dest) == 1
        pauses.clear()

    asyncio.run(scenario())


def test_the_ids_remembered_are_bounded_and_a_loop_turn_is_due_now_and_then() -> None:
    pauses = SendPauses()
    due = []
    for i in range(SEND_PAUSE_IDS * 3):
        due.append(pauses.sent(f"m{i}", "x"))
        if due[-1]:
            pauses.due = SEND_YIELD_EVERY  # what before_send does
    assert len(pauses._sent) + len(pauses._sent_before) <= 2 * SEND_PAUSE_IDS
    assert due.count(True) == SEND_PAUSE_IDS * 3 // SEND_YIELD_EVERY, "once every SEND_YIELD_EVERY"

    async def scenario() -> None:
        pauses.due = 0
        await pauses.before_send("x")  # the loop turn; no pause: returns
        assert pauses.due == SEND_YIELD_EVERY
        assert not pauses.sent("m", "x")
    asyncio.run(scenario())
