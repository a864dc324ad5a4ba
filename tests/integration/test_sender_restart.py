"""Issue 8, item 8: qos-0 sends while the sender's own daemon restarts are never lost in silence:
each one is delivered or reported to ``on_error``. Real daemons; the sender's daemon gets SIGTERM
and is started again while the agent keeps sending."""

from __future__ import annotations

import asyncio
import threading

import pytest

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, wait_listed


@pytest.mark.xfail(strict=False, reason="a few sends are still lost when the peer drops the restarted "
                   "daemon's first messages before its HELLO (peer liveness, issue 8 item 11)")
def test_qos0_sends_across_a_restart_of_the_senders_daemon(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    n = 300

    async def scenario() -> tuple[set[int], list[str], int]:
        handled: set[int] = set()
        errors: list[str] = []
        async with Agent("producer", socket=a.socket) as producer, \
                Agent("consumer", socket=b.socket) as consumer:
            producer.on_error = lambda err, corr: errors.append(f"{err.code}:{corr}")
            consumer.on("job")(lambda m: handled.add(m.payload["i"]))
            await wait_listed(producer, "consumer")
            restarted = threading.Event()

            def restart() -> None:
                a.stop()
                a.start()
                meshd_factory.wait_mesh([a, b])
                restarted.set()
            for i in range(n):
                if i == 50:
                    threading.Thread(target=restart, daemon=True).start()
                await producer.send("consumer", "job", {"i": i})
                await asyncio.sleep(0.01 if not restarted.is_set() and i >= 50 else 0)
            await async_wait_until(lambda: restarted.is_set(), timeout=30)

            def all_accounted() -> bool:
                return len(handled) + len(errors) >= n
            try:
                await async_wait_until(all_accounted, timeout=20)
            except TimeoutError:
                pass
            return handled, errors, producer.errors_received

    handled, errors, _ = asyncio.run(scenario())
    dropped_at_peer = b.query("node")["stats"].get("dropped_before_hello", 0)
    silent = n - len(handled) - len(errors)
    print(f"sender restart: {n} qos-0 sends, {len(handled)} handled, {len(errors)} reported, "
          f"{silent} lost in silence ({dropped_at_peer} batch(es) dropped by the peer before the "
          f"restarted daemon's HELLO)")
    assert silent <= 0
