"""A subscriber whose inbox is full misses publications; it is told how many,
per topic (a gap notice, like NATS's slow-consumer signal), and the daemon counts them per topic.
Real daemons; the subscriber is a raw client that reads nothing until the publisher is done."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import msgpack
import zmq

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, stuck_subscriber
from meshd.wire import protocol as P


def test_a_subscriber_is_told_how_many_publications_it_missed(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    ctx: zmq.Context[Any] = zmq.Context()
    n = 10_000  # coalesced into batches of up to 64: enough to fill both inboxes (about 5,400 fit)
    try:
        local = stuck_subscriber(ctx, a, "slow-local", "news")
        remote = stuck_subscriber(ctx, b, "slow-remote", "news")

        def heartbeat() -> None:
            for sock in (local, remote):
                sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "agent_hb"}), msgpack.packb({})])

        # Alive, just not reading: a thread beats for both subscribers while the publisher runs (a
        # beat every N publications missed the 2 s agent timeout on a loaded machine). Only this
        # thread touches the two sockets until it is joined.
        publishing_done = threading.Event()

        def beat_while_publishing() -> None:
            while not publishing_done.wait(0.2):
                heartbeat()
        beater = threading.Thread(target=beat_while_publishing, name="subscriber-heartbeats")
        beater.start()

        async def publish() -> None:
            async with Agent("pub", socket=a.socket) as pub:
                async def remote_listed() -> bool:
                    return any(x["name"] == "slow-remote" and "news" in x.get("topics", ())
                               for x in await pub.agents())
                await async_wait_until(remote_listed)
                for i in range(n):
                    await pub.publish("news", {"i": i, "pad": "x" * 200})
        try:
            asyncio.run(publish())
        finally:
            publishing_done.set()
            beater.join()
        figures = {}
        for name, sock in (("local", local), ("remote", remote)):
            received = missed = notices = 0
            deadline = time.monotonic() + 60  # bounded: a drain that keeps finding frames still ends
            last_beat = 0.0
            while time.monotonic() < deadline and sock.poll(1500):
                if time.monotonic() - last_beat > 0.2:
                    heartbeat()
                    last_beat = time.monotonic()
                frames = sock.recv_multipart()
                header = msgpack.unpackb(frames[1])
                if header.get("kind") == "publish":
                    received += 1
                elif header.get("kind") == "batch":  # publications coalesced by the publisher's client
                    received += sum(1 for h, _ in P.split_batch(frames) if h.get("kind") == "publish")
                elif header.get("kind") == "error":
                    code = header["error"]["code"]
                    assert code != P.ErrorCode.NOT_REGISTERED, f"{name}: subscriber dropped"
                    if code == "PUBLICATIONS_MISSED":
                        assert header["error"]["topic"] == "news"
                        missed += int(header["error"]["missed"])
                        notices += 1
            figures[name] = (received, missed, notices)
        counted = {p.name: p.query("node")["stats"].get("publish_missed:news", 0) for p in (a, b)}
        print(f"publication gaps: {n} published; (received, missed, notices) {figures}; "
              f"daemon counters {counted}")
        for name, (received, missed, _) in figures.items():
            assert received + missed == n, (name, received, missed)
            assert missed > 0, f"{name}: nothing was missed, so no gap notice was tested"
        assert counted == {"a": figures["local"][1], "b": figures["remote"][1]}
    finally:
        ctx.destroy(0)
