"""Agent processes for the task tests: run as subprocesses, so a test can kill -9 them.

    python task_agents.py workers --socket S --prefix P --count N --capability C --runs FILE
        N agents named P-0 .. P-(N-1), each serving tasks of capability C with a TaskWorker.
        Every handler run appends ``task_id attempt agent`` to FILE (line-buffered, so nothing
        written is lost when this or another process is killed), sleeps --delay seconds (or
        forever with --block), and returns ``{"by": agent, "input": input, "deps": deps}``.
        Touches FILE.ready once all are registered. Runs until SIGTERM/SIGINT.

    python task_agents.py owner --socket S --store DB --tasks N --capability C
        Attaches agent "owner", runs a TaskService on DB and, if the store has no plan yet,
        creates one plan of N tasks in layers of 10 (each task of a layer depends on one task of
        the layer before). Prints ``created PLAN`` and, when the plan is finished, ``finished
        STATE``; then waits for SIGTERM. Started again on the same DB, it resumes.

Every loop here is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

from meshd import Agent
from meshd.config.settings import Settings
from meshd.tasks import TaskCall, TaskService, TaskWorker
from meshd.testing import connect_until


async def _connect(name: str, socket: str, capabilities: list[str], deadline: float) -> Agent:
    return await connect_until(lambda: Agent(name, socket=socket, capabilities=capabilities,
                                             heartbeat_interval=0.2), deadline)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def workers(args: argparse.Namespace) -> int:
    stop = _stop_event()
    runs = open(args.runs, "a", buffering=1)  # noqa: SIM115, ASYNC230 - one line per handler run
    agents = []
    for i in range(args.count):
        agent = await _connect(f"{args.prefix}-{i}", args.socket, [args.capability], time.monotonic() + 30)

        async def handle(task: TaskCall, name: str = agent.name) -> Any:
            runs.write(f"{task.task_id} {task.attempt} {name}\n")
            runs.flush()
            if args.block:
                await asyncio.Event().wait()
            await asyncio.sleep(args.delay)
            return {"by": name, "input": task.input, "deps": task.deps}

        TaskWorker(agent, handle)
        agents.append(agent)
    Path(args.runs + ".ready").touch()  # noqa: ASYNC240 - once, before serving
    await stop.wait()
    for agent in agents:
        await agent.close()
    return 0


async def owner(args: argparse.Namespace) -> int:
    stop = _stop_event()
    agent = await _connect("owner", args.socket, [], time.monotonic() + 30)
    settings = Settings(tasks={"directory_refresh": 0.1, "dispatch_timeout": 20.0, "resume_grace": 20.0})
    service = TaskService(agent, Path(args.store), settings)
    await service.start()
    assert service.store is not None
    if not service.store.plans:
        tasks = []
        for i in range(args.tasks):
            deps = [f"t{i - 10 - (i % 3)}"] if i >= 10 and i - 10 - (i % 3) >= 0 else []
            tasks.append({"id": f"t{i}", "title": f"task {i}", "capability": args.capability,
                          "input": {"i": i}, "deps": deps})
        plan = await service.create_plan(creator="owner", tasks=tasks, deadline_s=600)
        print(f"created {plan['id']}", flush=True)
    plan_id = next(iter(service.store.plans))
    while not stop.is_set():
        state = service.plan_status(plan_id)["state"]
        if state != "running":
            print(f"finished {state}", flush=True)
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    await stop.wait()
    await service.stop()
    await agent.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    w = sub.add_parser("workers")
    w.add_argument("--socket", required=True)
    w.add_argument("--prefix", required=True)
    w.add_argument("--count", type=int, default=1)
    w.add_argument("--capability", required=True)
    w.add_argument("--runs", required=True)
    w.add_argument("--delay", type=float, default=0.0)
    w.add_argument("--block", action="store_true")
    o = sub.add_parser("owner")
    o.add_argument("--socket", required=True)
    o.add_argument("--store", required=True)
    o.add_argument("--tasks", type=int, default=200)
    o.add_argument("--capability", required=True)
    args = parser.parse_args()
    return asyncio.run(workers(args) if args.role == "workers" else owner(args))


if __name__ == "__main__":
    sys.exit(main())
