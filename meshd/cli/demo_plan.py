"""``meshd demo --plan``: a planner's plan run across agents on three daemons, picked by capability
and load, with a transcript.

Owns only this scenario: it reuses :mod:`meshd.cli.demo` for the daemons, discovery and clean-up, and
runs a :class:`meshd.tasks.TaskService` with the planner's agent (the daemon's system agent hosts
it when the tools are wired). What it shows, in order:

1. three ``meshd run`` daemons on 127.0.0.1 that find each other over zeroconf;
2. workers: researcher-a@node-2 (reports queue 0, context 15 %), researcher-b@node-3 (queue 1,
   context 60 %), writer@node-3 and verifier@node-2, each a :class:`meshd.tasks.TaskWorker`;
3. planner@node-1 creates a plan: three research tasks, a write task that needs all three and a
   verify task after it. The transcript prints every task event as it happens (who got which task
   and the load that decided it), then the plan's table;
4. clean-up as in ``meshd demo``.

Exit status: 0 when the plan ended done, 1 otherwise, 130 on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, TextIO

from meshd.cli.demo import (
    LOOPBACK,
    Demo,
    DemoFailed,
    _quiet_client_logs,
    _sigterm_as_interrupt,
    summarize,
)
from meshd.client import Agent
from meshd.config.settings import Settings, TaskSettings
from meshd.errors import MeshError
from meshd.tasks import TaskCall, TaskService, TaskWorker

__all__ = ["run_plan_demo"]

PLAN_TIMEOUT = 30.0
WORKERS = (  # name, node index, capabilities, reported queue depth, context %, seconds of "work"
    ("researcher-a", 1, ["research"], 0, 15, 0.3),
    ("researcher-b", 2, ["research"], 1, 60, 0.3),
    ("writer", 2, ["write"], 0, 30, 0.2),
    ("verifier", 1, ["verify"], 0, 20, 0.1),
)
PLAN: list[dict[str, Any]] = [
    {"id": "r1", "title": "find sources on zeroconf", "capability": "research", "input": "zeroconf"},
    {"id": "r2", "title": "find sources on ZeroMQ", "capability": "research", "input": "ZeroMQ"},
    {"id": "r3", "title": "find sources on CurveZMQ", "capability": "research", "input": "CurveZMQ"},
    {"id": "w", "title": "draft the summary", "capability": "write", "deps": ["r1", "r2", "r3"]},
    {"id": "v", "title": "verify the draft", "capability": "verify", "deps": ["w"]},
]


class PlanDemo(Demo):
    """The plan scenario on the three-daemon mesh of :class:`meshd.cli.demo.Demo`."""

    HEADLINE = (f"meshd demo --plan: three daemons, four workers and a planner on {LOOPBACK} "
                "(nothing leaves this host)")

    def __init__(self, out: TextIO, keep_logs: bool) -> None:
        super().__init__(out, keep_logs)
        self.service: TaskService | None = None
        self.t0 = time.perf_counter()
        self.plan_state = "not run"

    def _line(self, text: str) -> None:
        self.say(f"  +{(time.perf_counter() - self.t0) * 1000:6.0f} ms  {text}")

    def _event(self, event: str, data: dict[str, Any]) -> None:
        key = data.get("key") or data.get("id")
        if event == "plan.created":
            self._line(f"plan {data['id']} created by {data['creator']}: {data['tasks']} tasks")
        elif event == "task.assigned" and self.service is not None:
            seen = self.service.scheduler.directory.cached(str(data["assignee"]))
            tele = seen.get("telemetry") or {}
            where = f"{data['assignee']}@{seen.get('node_name', '?')}"
            load = (f"reported queue {tele.get('queue_depth', '?')}, "
                    f"context {tele.get('context_used_pct', '?')} %")
            self._line(f"{key:<3} {data['title']:<26} -> {where}  ({load})")
        elif event == "task.done" and self.service is not None:
            result = self.service.task_status(str(data["id"]))["result"]
            self._line(f"{key:<3} done by {data['assignee']}: {summarize(result, 60)}")
        elif event in ("task.failed", "task.retry", "task.waiting"):
            self._line(f"{key:<3} {event.split('.')[1]}: {data.get('error') or data.get('why')}")
        elif event.startswith("plan.") and event != "plan.created":
            self._line(f"plan {event.split('.')[1]}")

    async def collaborate(self) -> None:
        assert self.workdir is not None
        agents: list[Agent] = []
        for name, node, caps, queue, ctx, work in WORKERS:
            agent = Agent(name, socket=self.daemons[node].socket, capabilities=caps, heartbeat_interval=0.2)
            self.agents.append(agent)
            await self._bounded(f"attaching {name}", agent.connect())
            agent.set_telemetry(queue_depth=queue, context_used_pct=ctx)

            async def handle(task: TaskCall, who: str = name, pause: float = work) -> Any:
                await asyncio.sleep(pause)  # the "work"
                if task.capability == "research":
                    return f"3 sources on {task.input} ({who})"
                if task.capability == "write":
                    return f"summary of {len(task.deps)} findings"
                return {"verified": True, "checked": task.deps.get("w")}

            TaskWorker(agent, handle)
            agents.append(agent)
        planner = Agent("planner", socket=self.daemons[0].socket)
        self.agents.append(planner)
        await self._bounded("attaching the planner", planner.connect())

        async def directory_ready() -> bool:
            seen = {a["name"]: a for a in await planner.agents()}
            return all(seen.get(n, {}).get("state") == "online"
                       and (seen[n].get("telemetry") or {}).get("context_used_pct") == ctx
                       for n, _, _, _, ctx, _ in WORKERS)

        self.current = "waiting until node-1 lists every worker with its telemetry"
        end = time.monotonic() + 10
        while not await directory_ready():
            if time.monotonic() > end:
                raise DemoFailed("the workers' telemetry did not reach node-1 within 10 s")
            await asyncio.sleep(0.05)
        self.say()
        for name, node, caps, queue, ctx, _ in WORKERS:
            at = f"{name}@{self.daemons[node].name}"
            self.say(f"  worker {at:<20} capabilities {','.join(caps):<9} "
                     f"reports queue {queue}, context {ctx} %")
        self.say()
        self.current = "running the plan"
        settings = Settings(state_dir=self.workdir, tasks=TaskSettings(directory_refresh=0.1))
        self.service = TaskService(planner, self.workdir / "tasks.db", settings, emit=self._event)
        await self.service.start()
        try:
            self.t0 = time.perf_counter()
            plan = await self.service.create_plan(creator="planner", tasks=PLAN, deadline_s=PLAN_TIMEOUT)
            end = time.monotonic() + PLAN_TIMEOUT
            while self.service.plan_status(plan["id"])["state"] == "running":
                if time.monotonic() > end:
                    raise DemoFailed(f"the plan did not finish within {PLAN_TIMEOUT:g} s")
                await asyncio.sleep(0.02)
            status = self.service.plan_status(plan["id"])
            self.plan_state = status["state"]
            self.say()
            self.say(f"  {'task':<4} {'capability':<10} {'assignee':<22} {'attempts':<8} result")
            where = {n: self.daemons[i].name for n, i, *_ in WORKERS}
            for t in status["tasks"]:
                at = f"{t['assignee']}@{where[t['assignee']]}"
                self.say(f"  {t['key']:<4} {t['capability']:<10} {at:<22} {t['attempts']:<8} "
                         f"{summarize(t['result'], 50)}")
            if status["state"] != "done":
                raise DemoFailed(f"the plan ended {status['state']}")
        finally:
            await self.service.stop()

    def footer(self, ended: list[str]) -> None:
        self.say()
        took = time.perf_counter() - self.started
        self.say(f"Done in {took:.1f} s: planner@node-1 made a plan of 5 tasks; node-1's scheduler gave")
        self.say("  each ready task to the least-loaded online agent with its capability (reported queue")
        self.say("  depth, its own dispatches in flight, then context %), on node-2 and node-3, and passed")
        self.say("  the research results to the writer and the draft to the verifier.")
        self.say(f"  Clean-up: {'; '.join(ended)}; temp dir removed.")
        self.say("  docs/tasks.md explains scheduling, retries and why a task runs once across a crash.")


def run_plan_demo(keep_logs: bool = False) -> int:
    """Run the plan demo; returns the exit status (0 the plan ended done, 1 not, 130 interrupted)."""
    demo = PlanDemo(sys.stdout, keep_logs)
    status = 1
    error = None
    ended: list[str] = []
    with _sigterm_as_interrupt(), _quiet_client_logs():
        try:
            demo.start_daemons()
            asyncio.run(demo.run_async())
            status = 0
        except KeyboardInterrupt:
            status, error = 130, f"interrupted while {demo.current}"
        except (DemoFailed, MeshError, OSError) as exc:
            error = f"step failed while {demo.current}: {exc}"
        finally:
            try:
                if error is not None:
                    print(f"\nmeshd demo --plan: {error}", file=sys.stderr, flush=True)
                    if status == 1:
                        demo.print_log_tails()
            except OSError:  # stdout closed (a pipe): the daemons must still be stopped
                pass
            finally:
                ended = demo.cleanup()
    if status == 0:
        demo.footer(ended)
    demo.print_logs()
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_plan_demo(keep_logs="--keep-logs" in sys.argv[1:]))
