"""A publisher process for tests/integration/test_publish_flow.py: the README's plain loop.

    python publish_loop_agent.py SOCKET TOPIC N SUBSCRIBERS [BATCH_MAX]

Registers ``pub`` (``batch_max`` BATCH_MAX, default 64) on the daemon at SOCKET, publishes
``{"i": -1}`` with ``reach=True`` until SUBSCRIBERS subscribers are counted (warm-up: the
subscribers skip it), then ``{"i": 0..N-1, "pad": ...}`` with a plain ``await me.publish(...)``
loop, waits until the daemon confirmed them, and prints one JSON line: the loss reports it heard
(``on_error`` codes) and how often a subscriber's daemon asked it to pause for held publications.
In a process of its own so that it
does not share the subscribers' interpreter (and its lock): it runs at its own pace.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from meshd import Agent


async def main(socket: str, topic: str, n: int, subscribers: int, batch_max: int) -> None:
    async with Agent("pub", socket=socket, batch_max=batch_max) as pub:
        codes: list[str] = []
        pub.on_error = lambda err, _id: codes.append(err.code)
        deadline = time.monotonic() + 20
        while await pub.publish(topic, {"i": -1}, reach=True) != subscribers:
            if time.monotonic() > deadline:
                raise SystemExit("the subscribers were never all counted")
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        for i in range(n):
            await pub.publish(topic, {"i": i, "pad": "x" * 200})
        deadline = time.monotonic() + 30
        while pub._unconfirmed and time.monotonic() < deadline:  # noqa: ASYNC110 (bounded)
            await asyncio.sleep(0.01)
        print(json.dumps({"codes": codes, "held_pauses": pub._window.held_pauses,
                          "loop_s": time.monotonic() - t0}), flush=True)


if __name__ == "__main__":
    batch_max = int(sys.argv[5]) if len(sys.argv) > 5 else 64
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), batch_max))
