"""A plain ``await me.send(...)`` loop backs off by itself on INBOX_FULL, real daemons:
the sends to a slow receiver whose inbox fills are paused (and every message is delivered or
reported, in order), while the sends to a fast receiver in the same loop are never paused."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from meshd import Agent, BlockingAgent, MeshError
from meshd.testing import MeshdFactory, async_wait_until, wait_listed


def test_a_send_loop_pauses_for_a_full_inbox_and_not_for_another_destination(
        meshd_factory: MeshdFactory) -> None:
    n = 3000
    a = meshd_factory.spawn("a")  # the sender's and the slow receiver's: inbox_cap 100
    # The fast receiver's daemon: an inbox that holds every message, so it never refuses one.
    b = meshd_factory.spawn("b", env={**os.environ, "MESHD_INBOX_CAP": str(2 * n)})
    meshd_factory.wait_mesh([a, b])
    got: dict[str, list[int]] = {"slow": [], "fast": []}
    # The receivers run on threads of their own (their own event loops), as other processes would.
    slow = BlockingAgent("slow", socket=a.socket, max_concurrent_handlers=1)
    fast = BlockingAgent("fast", socket=b.socket)

    def slow_refused() -> int:
        return slow.agent._handler_slots.refused

    @slow.on("work")
    async def work(msg: Any) -> None:
        await asyncio.sleep(0.0005)  # holds the one handler slot: the agent stops reading
        got["slow"].append(msg.payload)

    @fast.on("work")
    def quick(msg: Any) -> None:
        got["fast"].append(msg.payload)

    async def scenario() -> tuple[Agent, dict[str, set[str]], int]:
        errors: list[tuple[MeshError, str | None]] = []
        sent: dict[str, str] = {}  # message id -> destination
        dropped = [0]
        # batch_max=1: one ZeroMQ message per send, so the slow agent's pipe (AGENT_RCVHWM) and
        # its daemon's inbox (inbox_cap), both counted in ZeroMQ messages, fill quickly.
        async with Agent("snd", socket=a.socket, batch_max=1) as snd:
            snd.on_error = lambda err, msg_id: errors.append((err, msg_id))
            await wait_listed(snd, "slow", "fast")
            for i in range(n):  # the plain loop: nothing in it waits for the receivers
                for to in ("slow", "fast"):
                    sent[await snd.send(to, "work", i)] = to

            async def accounted() -> bool:
                # Also reported: refused by the slow agent itself (work read while it awaited an
                # answer, past what it parks: a dead letter at its daemon, docs/client.md "Running
                # handlers"), or a refusal notice the daemon could not hold for the sender (past
                # the answer lane's notice room, counted as notices_dropped: docs/PROTOCOL.md §8.2;
                # the answers to calls, node_info's here, have room of their own).
                stats = (await snd.node_info())["stats"]
                assert stats.get("answers_dropped", 0) == 0, "no answer to a call is dropped"
                dropped[0] = stats.get("notices_dropped", 0)
                return len(got["slow"]) + len(errors) + slow_refused() + dropped[0] >= n
            await async_wait_until(accounted, 60, interval=0.1,
                                   what="every send to the slow agent handled or reported")
            await async_wait_until(lambda: len(got["fast"]) >= n, 30, what="every send to the fast one")
        refused: dict[str, set[str]] = {"slow": set(), "fast": set()}
        for err, msg_id in errors:
            assert err.code == "INBOX_FULL" and msg_id in sent, (err, msg_id)
            refused[sent[msg_id]].add(msg_id)
        return snd, refused, dropped[0]

    try:
        snd, refused, dropped = asyncio.run(scenario())
    finally:
        slow.close()
        fast.close()
    pauses = snd.send_pauses
    print(f"slow: {len(got['slow'])} delivered, {len(refused['slow'])} refused, {slow_refused()} "
          f"refused by the agent, {dropped} notices dropped, {pauses.pauses_of('slow')} pauses")
    assert pauses.pauses_of("slow") >= 1, "the slow agent's full inbox paused the send loop"
    assert pauses.pauses_of("fast") == 0 and not refused["fast"], "the fast one: never paused"
    assert got["fast"] == list(range(n)), "in order, none lost"
    assert len(got["slow"]) + len(refused["slow"]) + slow_refused() + dropped == n, \
        "each delivered or reported"
    assert got["slow"] == sorted(got["slow"]), "what went through went in order"
