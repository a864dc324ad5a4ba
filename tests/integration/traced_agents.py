"""Agent processes for the tracing tests, each with the OpenTelemetry SDK and an in-memory exporter.

    python traced_agents.py ROLE --socket S [--qos-out FILE]

Roles (each one process, its agents on the daemon at S):
  researcher  handles "research": asks verifier "verify" (answered), then "doubt" (its handler
              raises: a failed hop), then delegates the request to writer, who answers the
              original requester.
  verifier    two agents: verifier ("verify" answers, "doubt" raises) and writer ("research").
  worker      serves tasks of capability "summarize" (a TaskWorker): a task's handler.
  receiver    handles "job" sends (qos 1): appends each message's traceparent to --qos-out.
  sender      on a line ``send``: one qos-1 "job" to receiver under a span of its own; prints
              that span's trace id.

Prints ``ready`` once its agents are registered; on a line ``dump`` on stdin it closes its agents
and prints every finished span as one JSON line, then exits. Bounded: it exits by itself after
--max-seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from meshd import Agent, Message
from meshd.testing import connect_until, wait_listed

EXPORTER = InMemorySpanExporter()


def setup_sdk() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


def as_record(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent is not None else None,
        "links": [format(link.context.span_id, "016x") for link in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


async def connect(name: str, socket: str, setup: Any) -> Agent:
    def make() -> Agent:
        agent = Agent(name, socket=socket)
        setup(agent)
        return agent
    return await connect_until(make, time.monotonic() + 15)


async def researcher(socket: str) -> list[Agent]:
    def setup(agent: Agent) -> None:
        @agent.on("research")
        async def research(msg: Message) -> None:
            checked = await agent.request("verifier", "verify", {"claim": msg.payload})
            try:
                await agent.request("verifier", "doubt", {"claim": msg.payload})
            except Exception as exc:  # the failed hop: the researcher goes on without it
                checked["doubt"] = type(exc).__name__
            await agent.delegate(msg, "writer", payload={"claim": msg.payload, "checked": checked})

    agent = await connect("researcher", socket, setup)
    await wait_listed(agent, "verifier", "writer", timeout=15)
    return [agent]


async def verifier(socket: str) -> list[Agent]:
    def setup_verifier(agent: Agent) -> None:
        agent.on("verify")(lambda msg: {"verified": True})

        @agent.on("doubt")
        def doubt(msg: Message) -> None:
            raise ValueError("no source for that claim")

    def setup_writer(agent: Agent) -> None:
        @agent.on("research")
        async def write(msg: Message) -> dict[str, Any]:
            return {"report": "written", "input": msg.payload}

    return [await connect("verifier", socket, setup_verifier), await connect("writer", socket, setup_writer)]


async def worker(socket: str) -> list[Agent]:
    from meshd.tasks import TaskCall, TaskWorker

    agent = await connect_until(lambda: Agent("worker", socket=socket, capabilities=["summarize"]),
                                time.monotonic() + 15)

    async def handle(task: TaskCall) -> Any:
        return {"summary": f"short: {task.input}"}

    TaskWorker(agent, handle)
    return [agent]


async def receiver(socket: str, out: str) -> list[Agent]:
    def setup(agent: Agent) -> None:
        @agent.on("job")
        def job(msg: Message) -> None:
            with open(out, "a") as f:
                f.write(json.dumps(msg.headers.get("traceparent")) + "\n")

    return [await connect("receiver", socket, setup)]


async def sender(socket: str) -> list[Agent]:
    agent = await connect("sender", socket, lambda a: None)
    await wait_listed(agent, "receiver", timeout=15)
    return [agent]


async def send_job(agent: Agent) -> None:
    """One qos-1 send under a span of the application's; prints that span's trace id."""
    with trace.get_tracer("test").start_as_current_span("job batch") as span:
        await agent.send("receiver", "job", {"n": 1}, qos=1)
    print(format(span.get_span_context().trace_id, "032x"), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["researcher", "verifier", "worker", "receiver", "sender"])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--qos-out", default="")
    parser.add_argument("--max-seconds", type=float, default=90)
    args = parser.parse_args()
    setup_sdk()
    if args.role == "researcher":
        agents = await researcher(args.socket)
    elif args.role == "verifier":
        agents = await verifier(args.socket)
    elif args.role == "worker":
        agents = await worker(args.socket)
    elif args.role == "receiver":
        agents = await receiver(args.socket, args.qos_out)
    else:
        agents = await sender(args.socket)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + args.max_seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), left)
        except TimeoutError:
            break
        if line.strip() == "send" and args.role == "sender":
            await send_job(agents[0])
            continue
        break  # "dump", or stdin closed
    for agent in agents:
        await agent.close()
    for span in EXPORTER.get_finished_spans():
        print(json.dumps(as_record(span)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
