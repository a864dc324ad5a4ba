"""Task scheduling cost: create_task dispatch-to-done vs a plain request, and tasks/s with 8 workers.

    .venv/bin/python bench/tasks_bench.py            # ~30-50 s on a 2-core machine
    .venv/bin/python bench/tasks_bench.py --quick    # fewer rounds

Two real daemons (A, B) on 127.0.0.1 in a mesh of their own (``--insecure``, loopback only). The
bench process runs a TaskService on an agent "owner" attached to A (as the daemon's system agent
will); worker agents run in a helper process (this file with ``--workers``), 4 on A and 4 on B,
each a TaskWorker whose handler does no work, plus an "echo" topic for the plain request.

1. latency: the same worker (on B) answers N plain requests (owner -> worker, topic echo) and N
   tasks (``create_task`` until ``wait_task`` sees it done: one fsync'd commit of the assignment,
   the request, one fsync'd commit of the result), one at a time. Printed: p50 and p99 of each and
   the p50 ratio (goal: at most 2x), with ``tasks.fsync`` on (the default) and off.
2. throughput: T tasks created at once, scheduled over the 8 workers on 2 daemons; tasks/s from the
   first create to the last done, fsync on and off.

Every process and daemon is ended by PID at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshd import Agent
from meshd.config.settings import Settings, TaskSettings
from meshd.tasks import TaskCall, TaskService, TaskWorker
from meshd.testing import MeshdFactory, wait_until

WORKERS_PER_DAEMON = 4


# ----------------------------------------------------------------------------- worker helper

async def run_workers(socket: str, prefix: str, count: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agents = []
    for i in range(count):
        name = f"{prefix}{i}"
        caps = ["work", "only-b0"] if name == "b0" else ["work"]  # the latency run's tasks go to b0 only
        agent = Agent(name, socket=socket, capabilities=caps, heartbeat_interval=0.25)
        await agent.connect()

        @agent.on("echo")
        async def echo(msg: Any) -> Any:
            return msg.payload

        async def work(task: TaskCall) -> Any:
            return task.input

        TaskWorker(agent, work)
        agents.append(agent)
    print("ready", flush=True)
    await asyncio.wait_for(stop.wait(), 300)
    for agent in agents:
        await agent.close()


# ----------------------------------------------------------------------------- measurements

def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def latency(owner: Agent, workdir: Path, fsync: bool, n: int) -> dict[str, float]:
    settings = Settings(state_dir=workdir, tasks=TaskSettings(fsync=fsync, directory_refresh=0.25))
    service = TaskService(owner, workdir / f"lat-{fsync}.db", settings)
    await service.start()
    try:
        payload = {"body": "x" * 250}
        plain: list[float] = []
        for _ in range(n):
            t = time.perf_counter()
            await owner.request("b0", "echo", payload, timeout=10)
            plain.append(time.perf_counter() - t)
        tasks: list[float] = []
        for _ in range(n):
            t = time.perf_counter()
            rec = await service.create_task(creator="owner", title="echo", input=payload,
                                            capability="only-b0")
            done = await service.wait_task(rec["id"], 10)
            tasks.append(time.perf_counter() - t)
            assert done["state"] == "done", done
    finally:
        await service.stop()
    return {"plain_p50": pct(plain, 0.5) * 1e3, "plain_p99": pct(plain, 0.99) * 1e3,
            "task_p50": pct(tasks, 0.5) * 1e3, "task_p99": pct(tasks, 0.99) * 1e3}


async def throughput(owner: Agent, workdir: Path, fsync: bool, count: int) -> tuple[float, dict[str, int]]:
    settings = Settings(state_dir=workdir, tasks=TaskSettings(fsync=fsync, directory_refresh=0.25,
                                                               max_stored_tasks=max(10_000, count * 2)))
    service = TaskService(owner, workdir / f"tp-{fsync}.db", settings)
    await service.start()
    try:
        t = time.perf_counter()
        records = await asyncio.gather(*(service.create_task(creator="owner", title=f"t{i}", input=i,
                                                             capability="work") for i in range(count)))
        done = await asyncio.gather(*(service.wait_task(r["id"], 120) for r in records))
        took = time.perf_counter() - t
        assert all(d["state"] == "done" for d in done)
        per_agent: dict[str, int] = {}
        for d in done:
            per_agent[d["assignee"]] = per_agent.get(d["assignee"], 0) + 1
    finally:
        await service.stop()
    return count / took, dict(sorted(per_agent.items()))


async def measure(a_socket: Path, workdir: Path, quick: bool) -> None:
    n = 100 if quick else 300
    count = 200 if quick else 800
    async with Agent("owner", socket=a_socket) as owner:
        end = time.monotonic() + 20
        want = {f"{p}{i}" for p in "ab" for i in range(WORKERS_PER_DAEMON)}
        while want - {x["name"] for x in await owner.agents()}:
            if time.monotonic() > end:
                raise SystemExit("workers not listed within 20 s")
            await asyncio.sleep(0.1)
        print(f"latency, one at a time, {n} of each, owner on A -> worker b0 on B (~300-byte payload):")
        for fsync in (True, False):
            r = await latency(owner, workdir, fsync, n)
            print(f"  fsync={'on ' if fsync else 'off'}  plain request p50 {r['plain_p50']:.2f} ms "
                  f"p99 {r['plain_p99']:.2f} ms | create_task->done p50 {r['task_p50']:.2f} ms "
                  f"p99 {r['task_p99']:.2f} ms | ratio p50 {r['task_p50'] / r['plain_p50']:.2f}x "
                  "(goal <= 2x)")
        print(f"throughput, {count} tasks created at once, 8 workers on 2 daemons (no work in the handler):")
        for fsync in (True, False):
            rate, spread = await throughput(owner, workdir, fsync, count)
            print(f"  fsync={'on ' if fsync else 'off'}  {rate:.0f} tasks/s  per worker {spread}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", nargs=3, metavar=("SOCKET", "PREFIX", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workers:
        socket, prefix, count = args.workers
        asyncio.run(run_workers(socket, prefix, int(count)))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="mshd-tb-", dir="/tmp"))
    factory = MeshdFactory(workdir)
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        a = factory.spawn("a", fast=False)
        b = factory.spawn("b", fast=False)
        factory.wait_mesh([a, b])
        for daemon, prefix in ((a, "a"), (b, "b")):
            proc = subprocess.Popen([sys.executable, __file__, "--workers", str(daemon.socket), prefix,
                                     str(WORKERS_PER_DAEMON)], stdout=subprocess.PIPE)
            helpers.append(proc)
            assert proc.stdout is not None
            wait_until(lambda p=proc: p.stdout is not None and p.stdout.readline().strip() == b"ready", 30,
                       what="workers ready")
        asyncio.run(measure(a.socket, workdir, args.quick))
        return 0
    finally:
        for proc in helpers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        factory.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
