"""The sending agent's CPU per message, alone: a plain ``await me.send(...)`` loop on a real socket.

A real ``Agent`` sends with the README's loop (``await me.send(to, "bench", payload)``, the
compare.py payload built fresh per message) on a real DEALER over ipc. The other end is a bare
ROUTER in a child process that reads and drops everything (no daemon: nothing answers, nothing
is refused), so the sending process does only its own work. The agent is wired as ``connect``
wires it (loop, socket, reactor, send queue) without the registration a daemon would answer.
Prints the CPU per message of the sending process (``process_time``: the loop and libzmq's I/O
thread) and of its main thread alone (``thread_time``), best of ``--repeat``; ``--profile``
prints a cProfile table of one run; ``--pieces`` times each step of ``Agent.send`` apart
(timeit, the same objects, no socket), which is how bench/README.md says where each us goes.

    .venv/bin/python bench/send_path.py [--messages 200000] [--repeat 5] [--profile] [--pieces]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import multiprocessing
import os
import pstats
import tempfile
import time
import timeit
from typing import Any

import zmq
from common import make_payload

from meshd.client.agent import SEND_QUEUE_LIMIT, Agent
from meshd.client.batching import to_agent
from meshd.transport import Reactor, SendQueue, agent_dealer
from meshd.wire import protocol as P


def sink(address: str, ready: Any, stop: Any) -> None:
    """The child process: a ROUTER that reads and drops what arrives until ``stop`` is set."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(address)
    ready.set()
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while not stop.is_set():
        if poller.poll(100):
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
    sock.close()
    ctx.term()


def wire(agent: Agent, address: str, loop: asyncio.AbstractEventLoop) -> zmq.Socket[Any]:
    """What ``Agent.connect`` does, without registering (no daemon answers here)."""
    sock = agent_dealer(zmq.Context.instance())
    sock.connect(address)
    agent._loop = loop
    agent._sock = sock
    agent._reactor = Reactor(loop)
    agent._sendq = SendQueue(sock, agent._reactor, loop, SEND_QUEUE_LIMIT // agent.batch_max)
    agent._reactor.add(sock, lambda frames: None)
    return sock


async def one_run(address: str, messages: int, profile: bool) -> tuple[float, float]:
    agent = Agent("sender", socket="/nonexistent/send-path-bench.sock")
    sock = wire(agent, address, asyncio.get_running_loop())
    send = agent.send
    for i in range(1000):  # warm up: the connection is up and the code paths are hot
        await send("recv", "bench", make_payload(i))
    prof = cProfile.Profile() if profile else None
    t0, tt0 = time.process_time(), time.thread_time()
    if prof is not None:
        prof.enable()
    for i in range(messages):
        await send("recv", "bench", make_payload(i))
    if prof is not None:
        prof.disable()
    cpu, thread_cpu = time.process_time() - t0, time.thread_time() - tt0
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(16)
    agent._batcher.flush()
    await asyncio.sleep(0.05)  # let the send queue and the I/O thread finish
    assert agent._reactor is not None
    agent._reactor.remove(sock)
    sock.close(linger=0)
    return cpu / messages * 1e6, thread_cpu / messages * 1e6


def pieces(number: int = 100_000) -> None:
    """Each step of a qos-0 ``Agent.send`` timed apart, on an agent's own parts (no socket)."""
    agent = Agent("sender", socket="/nonexistent/send-path-bench.sock")
    pushed: list[list[bytes]] = []
    batcher = agent._batcher
    batcher._push, batcher._busy, batcher._schedule = pushed.append, lambda: True, lambda fn: None
    payload = make_payload(1)
    data = agent._payload(payload)
    key = to_agent("recv")
    ids = iter(range(10**9))

    def enqueue() -> None:  # a fresh header per message, as send makes it; batches of batch_max
        batcher.enqueue(key, {P.KIND: P.Kind.SEND, P.ID: "0123456789ab1f", P.TOPIC: "bench"}, data)
        if len(pushed) > 64:
            pushed.clear()

    steps: list[tuple[str, Any]] = [
        ("payload built (the caller's: compare.py's make_payload)", lambda: make_payload(1)),
        ("payload encoded (Agent._payload)", lambda: agent._payload(payload)),
        ("message id (P.new_id)", P.new_id),
        ("header dict", lambda: {P.KIND: P.Kind.SEND, P.ID: "0123456789ab1f", P.TOPIC: "bench"}),
        ("send pause bookkeeping (SendPauses.sent)", lambda: agent.send_pauses.sent(str(next(ids)), "recv")),
        ("resend window (ResendHold.remember)",
         lambda: agent._resend.remember(str(next(ids)), (key, {}, data))),
        ("batcher: enqueue, batch header, body, frames", enqueue),
        ("(str(next(ids)) inside the two above)", lambda: str(next(ids))),
    ]
    for name, fn in steps:
        agent.send_pauses.due = 10**9
        best = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
        print(f"{best:6.3f} us  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--pieces", action="store_true", help="time each step of Agent.send apart")
    args = ap.parse_args()
    if args.pieces:
        pieces()
        return
    with tempfile.TemporaryDirectory(prefix="sendpath-") as tmp:
        address = f"ipc://{os.path.join(tmp, 'sink.sock')}"
        ready, stop = multiprocessing.Event(), multiprocessing.Event()
        child = multiprocessing.Process(target=sink, args=(address, ready, stop), daemon=True)
        child.start()
        try:
            if not ready.wait(10):
                raise SystemExit("the sink did not start")
            results = []
            for _ in range(1 if args.profile else args.repeat):
                results.append(asyncio.run(one_run(address, args.messages, args.profile)))
                print(f"{results[-1][0]:.2f} us/msg process, {results[-1][1]:.2f} us/msg main thread")
            best = min(results)
            print(f"best: {best[0]:.2f} us/msg process, {min(r[1] for r in results):.2f} us/msg main "
                  f"thread ({args.messages} msgs, plain `await me.send(...)` loop, fresh payload)")
        finally:
            stop.set()
            child.join(5)
            if child.is_alive():
                child.kill()


if __name__ == "__main__":
    main()
