"""Publish flow control loses nothing: a plain ``await me.publish(...)`` loop to subscribers on
another daemon that are slower than the publisher loses nothing. Their daemon holds what a full
inbox refuses (meshd/delivery/publication_hold.py) and asks the publisher to pause (INBOX_FULL with ``held``)
before anything is dropped. A subscriber that reads nothing at all still misses publications,
with a gap notice, and neither stops the publisher nor the other subscribers. Real daemons."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from meshd import Agent, BlockingAgent, MeshError
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, stuck_subscriber, wait_listed
from meshd.wire import protocol as P

TOPIC = "flow"
HERE = Path(__file__).resolve().parent


def _slow_subscribers(b: MeshdProcess, count: int) -> tuple[list[BlockingAgent], dict[str, list[int]],
                                                            dict[str, list[MeshError]]]:
    """``count`` subscribers on ``b``, each on a thread of its own (its own event loop, as another
    process would be), with an ``async def`` handler that suspends once per message and one
    handler slot (so each stops reading until its handler finished): slower than the publisher's
    plain loop, so their inboxes fill."""
    subs: list[BlockingAgent] = []
    got: dict[str, list[int]] = {}
    errors: dict[str, list[MeshError]] = {}
    for k in range(count):
        name = f"sub{k}"
        sub = BlockingAgent(name, socket=b.socket, max_concurrent_handlers=1)
        got[name], errors[name] = [], []
        sub.agent.on_error = lambda err, _id, name=name: errors[name].append(err)

        async def handler(msg: Any, seen: list[int] = got[name]) -> None:
            if msg.payload["i"] >= 0:  # not a warm-up publication
                seen.append(msg.payload["i"])  # arrival order (the handler starts at once)
            await asyncio.sleep(0)  # it suspends: a task per message, as a real handler's await makes
        sub.on(TOPIC)(handler)
        sub.subscribe(TOPIC)
        subs.append(sub)
    return subs, got, errors


def _hold_stats(proc: MeshdProcess) -> dict[str, int]:
    stats = proc.query("node")["stats"]
    return {k: int(v) for k, v in stats.items() if k.startswith(("publish_hold", "publish_held",
                                                                   "publish_local_dropped",
                                                                   "publish_pause"))}


def test_a_plain_publish_loop_loses_nothing_to_slower_subscribers(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    n = 20_000
    subs, got, errors = _slow_subscribers(b, 3)
    try:
        # The publisher runs in a process of its own, at its own pace; the three subscribers share
        # this one's interpreter, so each is slower than it. batch_max=1: one ZeroMQ message per
        # publication, so the subscribers' pipes and inboxes (counted in ZeroMQ messages) fill
        # within 20,000 publications; in batches of 64 they hold ~70,000.
        out = subprocess.run([sys.executable, str(HERE / "publish_loop_agent.py"), str(a.socket), TOPIC,
                              str(n), str(len(subs)), "1"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        publisher = json.loads(out.stdout.strip().splitlines()[-1])

        def missed(name: str) -> int:
            return sum(int(e.details.get("missed", 0)) for e in errors[name])

        # Bounded: every publication arrives, or is reported missed in a gap notice.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(len(got[s]) + missed(s) < n for s in got):
            time.sleep(0.05)
        stats = _hold_stats(b)
        print(f"publish flow: {n} published to {len(subs)} slower subscribers; received "
              f"{ {s: len(v) for s, v in got.items()} }, missed { {s: missed(s) for s in got} }; "
              f"publisher {publisher}; daemon b {stats}")
        for name, seen in got.items():
            assert missed(name) == 0 and not errors[name], f"{name} missed publications: {errors[name][:3]}"
            assert seen == list(range(n)), f"{name}: every publication, in order"
        assert publisher["codes"] == [], "nothing was lost, so the publisher heard of no loss"
        assert stats.get("publish_local_dropped", 0) == 0
        # The case was the one meant: the subscribers fell behind, their daemon held publications
        # for them and the publisher paused (else this test would not test the flow control).
        assert stats.get("publish_held", 0) > 0 and publisher["held_pauses"] > 0
        assert stats.get("publish_hold_delivered", 0) == stats["publish_held"]
    finally:
        for sub in subs:
            sub.close()


def test_a_stuck_subscriber_misses_publications_and_stops_neither_the_publisher_nor_the_others(
        meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    n = 10_000
    ctx: zmq.Context[Any] = zmq.Context()
    subs, got, errors = _slow_subscribers(b, 1)
    stuck = stuck_subscriber(ctx, b, "stuck", TOPIC)
    done = threading.Event()

    def beat() -> None:  # alive, just not reading; only this thread touches the socket meanwhile
        while not done.wait(0.2):
            stuck.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "agent_hb"}), msgpack.packb({})])
    beater = threading.Thread(target=beat, name="stuck-heartbeats")
    beater.start()
    try:
        async def publish() -> list[MeshError]:
            async with Agent("pub", socket=a.socket) as pub:
                lost: list[MeshError] = []
                pub.on_error = lambda err, _id: lost.append(err)

                async def both_counted() -> bool:
                    return await pub.publish(TOPIC, {"i": -1}, reach=True) == 2
                await wait_listed(pub, "sub0", "stuck")
                await async_wait_until(both_counted, 15, interval=0.05, what="both subscribers counted")
                for i in range(n):  # ends: the stuck subscriber does not hold the loop up for good
                    await pub.publish(TOPIC, {"i": i, "pad": "x" * 200})
                return lost

        # Bounded (a hang guard, not a timing assertion): a publisher paused for good fails here.
        lost = asyncio.run(asyncio.wait_for(publish(), 120))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(got["sub0"]) < n:
            time.sleep(0.05)
        stats = b.query("node")["stats"]
        missed = int(stats.get(f"publish_missed:{TOPIC}", 0))
        print(f"stuck subscriber: {n} published; the reading subscriber received {len(got['sub0'])}; "
              f"the stuck one missed {missed}; the publisher heard {len(lost)} loss report(s)")
        assert got["sub0"] == list(range(n)), "the subscriber that reads gets every publication, in order"
        assert not errors["sub0"]
        assert missed > 0, "the stuck subscriber's hold is bounded: it misses publications"
        assert lost and all(e.code == "INBOX_FULL" for e in lost), "the publisher hears of the loss"
    finally:
        done.set()
        beater.join()
        for sub in subs:
            sub.close()
        ctx.destroy(0)
