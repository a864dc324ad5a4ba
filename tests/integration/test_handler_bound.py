"""Backpressure end to end in the Python client, with real daemons.

* A slow ``async def`` handler runs at most ``max_concurrent_handlers`` at once; while they are all
  taken the agent stops reading, so the backlog stays in its daemon's inbox, where ``inbox_cap``
  applies and senders get INBOX_FULL: every request is answered or refused, none is lost.
* A client keeps at most the daemon's ``in_flight_max`` calls awaiting an answer: more concurrent
  calls wait their turn (in order) instead of being sent, and every one is answered.
* A handler that itself awaits a request while every slot is taken still gets its reply.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

from meshd import Agent, InboxFull, RequestTimeout
from meshd.testing import MeshdFactory, async_wait_until, wait_listed


class Concurrency:
    """Counts the handlers running at once, from inside them."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


def test_a_slow_handler_runs_at_most_its_bound_and_senders_get_inbox_full(
        meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    n, bound = 3000, 8

    async def scenario() -> Counter[str]:
        running = Concurrency()
        outcomes: Counter[str] = Counter()
        # batch_max=1: one ZeroMQ message per request, so the agent's pipe (AGENT_RCVHWM) and the
        # daemon's inbox (inbox_cap=100), both counted in ZeroMQ messages, fill in about 2,000
        # requests; six callers have 3,000 in flight (each one keeps in_flight_max/2).
        callers = [Agent(f"caller{k}", socket=a.socket, batch_max=1) for k in range(6)]
        async with Agent("slow", socket=a.socket, max_concurrent_handlers=bound) as slow:
            @slow.on("work")
            async def work(msg: Any) -> Any:
                running.enter()
                try:
                    await asyncio.sleep(0.05)
                finally:
                    running.leave()
                return msg.payload

            for caller in callers:
                await caller.connect()
            await wait_listed(callers[0], "slow")

            async def one(i: int) -> None:
                try:
                    answer = await callers[i % 6].request("slow", "work", i, timeout=60)
                    outcomes["answered" if answer == i else "wrong answer"] += 1
                except InboxFull:
                    outcomes["inbox_full"] += 1
                except RequestTimeout:
                    outcomes["timed out"] += 1

            try:
                await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 120)
            finally:
                for caller in callers:
                    await caller.close()
            outcomes["peak"] = running.peak
        return outcomes

    outcomes = asyncio.run(scenario())
    print(f"slow handler, bound {bound}: {dict(outcomes)}")
    assert outcomes["peak"] <= bound, outcomes
    assert outcomes["answered"] + outcomes["inbox_full"] == n, f"none lost, none timed out: {outcomes}"
    assert outcomes["inbox_full"] > 0, "the backlog stayed in the daemon's inbox, where the cap applies"
    assert outcomes["answered"] >= bound


def test_more_concurrent_calls_than_in_flight_max_wait_their_turn(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={**os.environ, "MESHD_AGENT_ANSWER_BACKLOG": "16"})
    n = 300

    async def scenario() -> tuple[int, int]:
        at_responder = Concurrency()
        async with Agent("echo", socket=a.socket, max_concurrent_handlers=1000) as echo, \
                Agent("caller", socket=a.socket) as caller:
            echo.on("note")(lambda msg: None)

            @echo.on("echo")
            async def on_echo(msg: Any) -> Any:
                at_responder.enter()
                try:
                    await asyncio.sleep(0.01)
                finally:
                    at_responder.leave()
                return msg.payload

            await wait_listed(caller, "echo")
            allowance = caller.in_flight_max
            answers = await asyncio.wait_for(asyncio.gather(
                *(caller.request("echo", "echo", i, timeout=30) for i in range(n))), 60)
            assert answers == list(range(n)), "every request answered, in place, none refused"
            # qos-1 sends, confirmed publishes and control queries take their turn the same way.
            ids = await asyncio.wait_for(asyncio.gather(
                *(caller.send("echo", "note", i, qos=1) for i in range(n))), 60)
            assert len(set(ids)) == n
            reaches = await asyncio.wait_for(asyncio.gather(
                *(caller.publish("nobody", i, reach=True) for i in range(n))), 60)
            assert reaches == [0] * n
            infos = await asyncio.wait_for(asyncio.gather(*(caller.node_info() for _ in range(n))), 60)
            assert all(info.get("node") == caller.node for info in infos)
            return allowance, at_responder.peak

    allowance, peak = asyncio.run(scenario())
    print(f"in flight: allowance={allowance} peak at the responder={peak}")
    # The daemon keeps 16 answers for a connection that is not reading; the publish window has its
    # own share of them (half), awaited calls the rest.
    assert 1 <= peak <= allowance <= 16


def test_a_saturated_handler_still_gets_the_reply_it_awaits(meshd_factory: MeshdFactory) -> None:
    """Every slot is taken by handlers that each await a request of their own: the agent keeps
    reading (answers must get through), so they finish instead of waiting for their time-out."""
    a = meshd_factory.spawn("a")
    bound = 4

    async def scenario() -> list[Any]:
        async with Agent("asker", socket=a.socket, max_concurrent_handlers=bound) as asker, \
                Agent("oracle", socket=a.socket) as oracle, \
                Agent("caller", socket=a.socket) as caller:
            @oracle.on("q")
            async def answer(msg: Any) -> Any:
                await asyncio.sleep(0.05)
                return msg.payload * 2

            @asker.on("ask")
            async def ask(msg: Any) -> Any:
                return await asker.request("oracle", "q", msg.payload, timeout=10)

            await wait_listed(caller, "asker")
            await wait_listed(asker, "oracle")
            return list(await asyncio.wait_for(asyncio.gather(
                *(caller.request("asker", "ask", i, timeout=20) for i in range(40))), 30))

    assert asyncio.run(scenario()) == [i * 2 for i in range(40)]


def test_qos1_work_to_a_saturated_agent_that_awaits_answers_runs_once_each(
        meshd_factory: MeshdFactory) -> None:
    """Two slots, each handler awaits a request of its own, 600 qos-1 sends arrive at once: the
    agent reads on for its answers, parks the qos-1 work (never refused) and handles each once."""
    a = meshd_factory.spawn("a")
    n = 600

    async def scenario() -> Counter[int]:
        handled: Counter[int] = Counter()
        async with Agent("worker", socket=a.socket, max_concurrent_handlers=2) as worker, \
                Agent("oracle", socket=a.socket) as oracle, \
                Agent("producer", socket=a.socket) as producer:
            @oracle.on("q")
            async def answer(msg: Any) -> Any:
                await asyncio.sleep(0.002)
                return msg.payload

            @worker.on("job")
            async def job(msg: Any) -> None:
                assert await worker.request("oracle", "q", msg.payload, timeout=10) == msg.payload
                handled.update([msg.payload])

            await wait_listed(producer, "worker")
            await wait_listed(worker, "oracle")
            await asyncio.wait_for(asyncio.gather(
                *(producer.send("worker", "job", i, qos=1) for i in range(n))), 60)
            await async_wait_until(lambda: len(handled) == n, 60, what=f"{n} jobs handled")
            await async_wait_until(lambda: a.query("node")["qos1"]["pending"] == 0, 30,
                                   what="every unit acked")
            print(f"qos-1 to a saturated agent: {n} sent, {len(handled)} handled, "
                  f"peak parked {worker._handler_slots.peak_parked}")
        return handled

    handled = asyncio.run(scenario())
    assert sorted(handled) == list(range(n))
    assert max(handled.values()) == 1
