"""Agent processes for the qos-1 fault tests: run as subprocesses, so a test can kill -9 them.

    python qos_agents.py receiver --socket S --name N --out FILE
        Handles topic "job"; for every handler run appends ``i a id`` (payload index, send
        attempt, message id) to FILE and flushes, so a handler that ran twice shows up twice and
        nothing written is lost when this process is killed. Touches FILE.ready once registered.
        Runs until SIGTERM/SIGINT (or --max-seconds). With --kill-at I it sends SIGKILL, once,
        to --kill-pid (its daemon, started by the test) or to itself (--kill-pid 0) right after
        the handler for the first message with index >= I ran: a kill with work in flight.

    python qos_agents.py sender --socket S --name N --to R --count 2000 --out FILE
        Waits until R is listed, then sends ``{"i": i, "a": attempt}`` with qos=1, at most
        --window sends outstanding at a time (a sliding window of tasks, optionally paced by
        --pace seconds after every 10 sends), and appends ``i a latency_s`` to FILE for every
        send the daemon confirmed (on disk). A send that fails (DaemonUnreachable when the daemon
        dies, NOT_REGISTERED right after it restarted, or no confirmation within --send-timeout)
        is recorded as unconfirmed and sent again later as a new message (attempt a+1), as an
        application would; only confirmed sends are the daemon's promise. Exits 0 once every i
        is confirmed, 1 if --deadline passes first.

Every loop here is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from meshd import Agent
from meshd.errors import MeshError


async def _connect(args: argparse.Namespace, deadline: float) -> Agent:
    """Connect, retrying while the daemon is not there yet (bounded by ``deadline``)."""
    last: BaseException | None = None
    for _ in range(1000):
        if time.monotonic() > deadline:
            break
        agent = Agent(args.name, socket=args.socket, heartbeat_interval=args.heartbeat)
        try:
            await agent.connect()
            return agent
        except (MeshError, OSError) as exc:
            last = exc
            with contextlib.suppress(Exception):
                await agent.close()
            await asyncio.sleep(0.2)
    raise SystemExit(f"{args.name}: could not connect to {args.socket}: {last!r}")


async def receiver(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agent = await _connect(args, time.monotonic() + 30)
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - line buffered, flushed per run

    kill_pending = args.kill_at >= 0

    @agent.on("job")
    def job(msg: Any) -> None:
        nonlocal kill_pending
        p = msg.payload
        out.write(f"{p['i']} {p.get('a', 0)} {msg.id}\n")
        out.flush()
        if kill_pending and p["i"] >= args.kill_at:
            # Fault injection at a known point: this handler has finished, its unit is not acked
            # yet, and the rest of its batch may still be unhandled.
            kill_pending = False
            os.kill(args.kill_pid or os.getpid(), signal.SIGKILL)

    Path(args.out + ".ready").write_text(f"{agent.node}\n")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), args.max_seconds)
    out.flush()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(agent.close(), 3)
    out.close()
    return 0


async def _listed(agent: Agent, name: str, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(MeshError, TimeoutError):
            if name in {a["name"] for a in await agent.agents()}:
                return True
        await asyncio.sleep(0.05)
    return False


async def sender(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    deadline = t_start + args.deadline
    agent = await _connect(args, deadline)
    if not await _listed(agent, args.to, 20):
        print(f"sender: {args.to!r} never listed", file=sys.stderr)
        return 2
    out = open(args.out, "a", buffering=1)  # noqa: SIM115
    attempt = [0] * args.count
    todo = list(range(args.count))
    failures: dict[str, int] = {}

    async def one(i: int) -> tuple[int, float | BaseException]:
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(agent.send(args.to, "job", {"i": i, "a": attempt[i]}, qos=1),
                                   args.send_timeout)
        except (MeshError, TimeoutError) as exc:
            return i, exc
        return i, time.monotonic() - t0

    rounds = 0
    while todo and rounds < 200 and time.monotonic() < deadline:
        rounds += 1
        failed: list[int] = []
        window = asyncio.Semaphore(args.window)
        tasks: list[asyncio.Task[tuple[int, float | BaseException]]] = []

        async def bounded(i: int) -> tuple[int, float | BaseException]:
            try:
                return await one(i)
            finally:
                window.release()

        def record(task: asyncio.Task[tuple[int, float | BaseException]]) -> None:
            i, result = task.result()
            if isinstance(result, BaseException):
                failures[type(result).__name__] = failures.get(type(result).__name__, 0) + 1
                attempt[i] += 1
                failed.append(i)
            else:
                out.write(f"{i} {attempt[i]} {result:.6f}\n")

        # A sliding window: at most --window sends outstanding, a steady stream (no idle gaps
        # between windows in which a kill would find nothing in flight).
        for n, i in enumerate(todo):
            await window.acquire()
            task = asyncio.create_task(bounded(i))
            task.add_done_callback(record)
            tasks.append(task)
            if args.pace and n % 10 == 9:
                await asyncio.sleep(args.pace)
        await asyncio.gather(*tasks)
        out.flush()
        todo = sorted(failed)
        if todo:
            await asyncio.sleep(0.5)  # the daemon restarts; the client registers again on its own
    out.close()
    print(f"sender: rounds={rounds} unconfirmed_sends={sum(failures.values())} {failures} "
          f"left={len(todo)} in {time.monotonic() - t_start:.2f} s", file=sys.stderr)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(agent.close(), 3)
    return 0 if not todo else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="role", required=True)
    r = sub.add_parser("receiver")
    s = sub.add_parser("sender")
    for p in (r, s):
        p.add_argument("--socket", required=True)
        p.add_argument("--name", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--heartbeat", type=float, default=0.25)
    r.add_argument("--max-seconds", type=float, default=300.0)
    r.add_argument("--kill-at", type=int, default=-1)
    r.add_argument("--kill-pid", type=int, default=0)
    s.add_argument("--to", required=True)
    s.add_argument("--count", type=int, default=2000)
    s.add_argument("--window", type=int, default=100)
    s.add_argument("--pace", type=float, default=0.0, help="seconds to sleep after every 10 sends")
    s.add_argument("--send-timeout", type=float, default=4.0)
    s.add_argument("--deadline", type=float, default=90.0)
    args = ap.parse_args()
    return asyncio.run(receiver(args) if args.role == "receiver" else sender(args))


if __name__ == "__main__":
    sys.exit(main())
