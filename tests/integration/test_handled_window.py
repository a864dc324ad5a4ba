"""A receiving daemon that dies mid-stream while its agent survives must not
make the agent run a handler twice. The agent keeps a window of the qos-1 units it handled and
acks a redelivered one again instead of running it.

The crash window is made certain, not left to chance: the handlers wait until the receiving
daemon is paused (SIGSTOP), so their acks sit unread in its socket when it is killed (SIGKILL)
and no done-mark was written. After its restart the sender retries every unit, and each one
reaches the surviving agent a second time."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from typing import Any

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, wait_listed


def test_a_daemon_restart_never_repeats_a_handler(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={"MESHD_QOS1_ACK_TIMEOUT": "0.5", "MESHD_QOS1_ATTEMPTS": "20"})
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    n = 200

    async def scenario() -> tuple[Counter[int], int]:
        runs: Counter[int] = Counter()
        started: set[int] = set()
        release = asyncio.Event()
        async with Agent("producer", socket=a.socket) as producer, \
                Agent("consumer", socket=b.socket, max_concurrent_handlers=n) as consumer:
            @consumer.on("job")
            async def job(m: Any) -> None:
                started.add(m.payload["i"])
                await release.wait()
                runs.update([m.payload["i"]])

            await wait_listed(producer, "consumer")
            await asyncio.gather(*(producer.send("consumer", "job", {"i": i}, qos=1) for i in range(n)))
            await async_wait_until(lambda: len(started) == n, timeout=30)
            os.kill(b.pid, signal.SIGSTOP)  # the acks the handlers send now are never read
            release.set()
            await async_wait_until(lambda: len(runs) == n, timeout=30)  # handled once each
            await asyncio.sleep(0)  # let the client push its acks (into the paused daemon's socket)
            b.kill()
            b.start()

            def settled() -> bool:
                return int(a.query("node")["qos1"]["pending"]) == 0
            await async_wait_until(settled, timeout=60)  # every unit acked after the restart
            return runs, sum(1 for c in runs.values() if c > 1)

    runs, repeated = asyncio.run(scenario())
    print(f"handled window: {n} qos-1 messages, receiving daemon killed before its done-marks: "
          f"handlers run {sum(runs.values())} times, {repeated} repeated")
    assert sorted(runs) == list(range(n))
    assert repeated == 0
