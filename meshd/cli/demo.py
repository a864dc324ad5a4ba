"""``meshd demo``: a three-daemon mesh on 127.0.0.1 and a short collaboration between agents.

What it does, in order:

1. starts three real ``meshd run`` daemons (node-1..3) as subprocesses in a fresh temp dir, all
   bound to 127.0.0.1, in a uniquely named mesh, and waits until each one has discovered the
   other two over zeroconf (no static peers) and sees them online;
2. attaches three agents with the asyncio client: planner@node-1, researcher@node-2 and
   verifier@node-3 (which subscribes to "findings");
3. runs a collaboration that crosses daemons with every primitive: list, request/reply (with a
   nested request), publish, send, and two typed errors (NoSuchAgent, HandlerError), printing one
   transcript line per step with its latency;
4. cleans up whatever happened: agents closed, daemons SIGTERMed (SIGKILLed after 10 s), the temp
   dir removed.

Exit status: 0 when every step worked, 1 when one failed (the daemons' log tails are printed),
130 on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO, TypeVar

from meshd.client import Agent, Message
from meshd.errors import HandlerError, MeshError, NoSuchAgent
from meshd.util.daemon_process import DaemonProcess

T = TypeVar("T")

NODE_NAMES = ("node-1", "node-2", "node-3")
LOOPBACK = "127.0.0.1"
TOPIC = "findings"
SOCKET_TIMEOUT = 15.0  # a daemon's agent socket must appear within this
MESH_TIMEOUT = 20.0  # discovery: every daemon sees the other two online
STEP_TIMEOUT = 5.0  # any single step of the collaboration
STOP_TIMEOUT = 10.0  # SIGTERM -> SIGKILL
LOG_TAIL_LINES = 30
PROBE_PREFIX = "demo-probe-"
PAYLOAD_WIDTH = 60  # payload column when stdout is not a terminal


class DemoFailed(Exception):
    """A step of the demo did not do what it should; the message says which and why."""


# --------------------------------------------------------------------------------- daemons


class Daemon(DaemonProcess):
    """One ``meshd run`` subprocess of the demo (loopback, plaintext), and what the demo learned of it."""

    def __init__(self, name: str, mesh: str, dir: Path, log_level: str = "warning") -> None:
        super().__init__(name, mesh, dir, args=["--interface", LOOPBACK, "--log-level", log_level])
        self.node_id = ""
        self.router = ""
        self.pub = ""

    def wait_stopped(self, deadline: float) -> str:
        """Wait for the exit until ``deadline`` (monotonic), then SIGKILL. Says how it ended."""
        if self.proc is None:
            return "never started"
        try:
            code = self.wait_exit(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            return f"did not stop within {STOP_TIMEOUT:g} s of SIGTERM: killed"
        return f"exited {code}"

    def log_lines(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of its log (all of it for 0)."""
        text = self.log_tail(0)
        return "\n".join(text.splitlines()[-lines:]) if lines else text


def wait_for_sockets(daemons: list[Daemon], timeout: float = SOCKET_TIMEOUT) -> None:
    end = time.monotonic() + timeout
    waiting = list(daemons)
    while waiting:
        for d in list(waiting):
            code = d.exited()
            if code is not None:
                raise DemoFailed(f"meshd {d.name} exited with status {code} while starting")
            if d.socket.exists():
                waiting.remove(d)
        if not waiting:
            return
        if time.monotonic() > end:
            names = ", ".join(d.name for d in waiting)
            raise DemoFailed(f"no agent socket from {names} after {timeout:g} s")
        time.sleep(0.02)


# --------------------------------------------------------------------------------- transcript


def summarize(value: Any, width: int = PAYLOAD_WIDTH) -> str:
    """A one-line JSON rendering of a payload, cut to ``width`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


_NO_PAYLOAD = object()


@dataclass
class Transcript:
    """Prints one aligned line per step: who -> whom, primitive, topic, latency, payload/result.

    A step's result text (an error, a count) is printed whole; its payload is cut to fit.
    """

    out: TextIO
    lines: int = 0
    primitives: list[str] = field(default_factory=list)

    COLUMNS = ("#", "from", "", "to", "primitive", "topic", "ms", "payload / result")
    FIXED = 74  # characters before the payload column

    def _row(self, cols: tuple[str, ...]) -> str:
        num, sender, arrow, to, prim, topic, latency, rest = cols
        return (f"  {num:>2}  {sender:<19} {arrow:2} {to:<17} {prim:<9} {topic:<8} {latency:>6}  "
                f"{rest}").rstrip()

    @property
    def width(self) -> int:
        """Room for payloads: what a terminal has left (at least 30), else PAYLOAD_WIDTH."""
        isatty = getattr(self.out, "isatty", None)
        if callable(isatty) and isatty():
            return min(100, max(30, shutil.get_terminal_size().columns - self.FIXED - 1))
        return PAYLOAD_WIDTH

    def header(self) -> None:
        self.print(self._row(self.COLUMNS))
        self.print("  " + "-" * (self.FIXED - 2 + min(self.width, 50)))

    def step(self, sender: str, to: str, primitive: str, topic: str, text: str = "",
             payload: Any = _NO_PAYLOAD, *, ms: float | None = None, depth: int = 0) -> None:
        self.lines += 1
        self.primitives.append(primitive)
        latency = f"{ms:.1f}" if ms is not None else "-"
        sender = "  " * depth + sender
        detail = text
        if payload is not _NO_PAYLOAD:
            room = max(20, self.width - len(text) - 1) if text else self.width
            detail = f"{text} {summarize(payload, room)}" if text else summarize(payload, room)
        self.print(self._row((str(self.lines), sender, "->", to, primitive, topic, latency, detail)))

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


# --------------------------------------------------------------------------------- the demo


class Demo:
    #: The first line of the transcript (a scenario on the same mesh says what it runs).
    HEADLINE = f"meshd demo: three daemons and three agents on {LOOPBACK} (nothing leaves this host)"

    def __init__(self, out: TextIO, keep_logs: bool) -> None:
        self.out = out
        self.keep_logs = keep_logs
        self.mesh = f"demo-{secrets.token_hex(4)}"
        self.workdir: Path | None = None
        self.daemons: list[Daemon] = []
        self.agents: list[Agent] = []
        self.logs: list[tuple[str, str]] = []
        self.t = Transcript(out)
        self.current = "starting"
        self.started = self.launched = time.perf_counter()

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    # ------------------------------------------------------------------ set-up

    def start_daemons(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="meshd-demo-", dir="/tmp"))
        self.say(self.HEADLINE)
        self.say()
        self.say(f"  mesh      {self.mesh}")
        self.say(f"  temp dir  {self.workdir}")
        self.current = "starting the daemons"
        self.launched = time.perf_counter()
        for i, name in enumerate(NODE_NAMES, 1):
            daemon = Daemon(name, self.mesh, self.workdir / f"n{i}",
                            log_level="info" if self.keep_logs else "warning")
            self.daemons.append(daemon)
            daemon.start()
        wait_for_sockets(self.daemons)

    async def _bounded(self, what: str, aw: Awaitable[T], timeout: float = STEP_TIMEOUT) -> T:
        self.current = what
        try:
            return await asyncio.wait_for(aw, timeout)
        except TimeoutError:
            raise DemoFailed(f"no result within {timeout:g} s") from None

    async def wait_mesh(self) -> None:
        """Poll each daemon (through a short-lived probe agent) until it sees the others online."""
        self.current = "waiting for zeroconf discovery"
        probes = [Agent(f"{PROBE_PREFIX}{d.name}", socket=d.socket) for d in self.daemons]
        try:
            for probe in probes:
                await self._bounded("attaching a probe agent", probe.connect())
            for d, probe in zip(self.daemons, probes, strict=True):
                info = await probe.node_info()
                d.node_id = str(info["node"])
                d.router = str((info.get("routers") or ["?"])[0])
                d.pub = str((info.get("pubs") or ["?"])[0])
            self.current = "waiting for zeroconf discovery"
            end = time.monotonic() + MESH_TIMEOUT
            while True:
                missing = []
                for d, probe in zip(self.daemons, probes, strict=True):
                    online = {p["node"] for p in await probe.peers() if p.get("state") == "online"}
                    missing += [f"{d.name} does not see {o.name}" for o in self.daemons
                                if o is not d and o.node_id not in online]
                if not missing:
                    break
                for d in self.daemons:
                    if d.exited() is not None:
                        raise DemoFailed(f"meshd {d.name} exited with status {d.exited()}")
                if time.monotonic() > end:
                    raise DemoFailed(f"the mesh did not form within {MESH_TIMEOUT:g} s: "
                                     + "; ".join(missing))
                await asyncio.sleep(0.05)
        finally:
            await asyncio.gather(*(p.close() for p in probes), return_exceptions=True)
        took = ms_since(self.launched)
        for d in self.daemons:
            pid = d.proc.pid if d.proc else "?"
            self.say(f"  {d.name:<8}  id {d.node_id}  router {d.router}  pub {d.pub}  pid {pid}")
        self.say(f"  mesh up   {took:.0f} ms after launch, every daemon sees the other two online "
                 "(zeroconf discovery, no static peers)")

    # ------------------------------------------------------------------ the collaboration

    async def collaborate(self) -> None:
        t = self.t
        n1, n2, n3 = self.daemons
        planner = Agent("planner", socket=n1.socket)
        researcher = Agent("researcher", socket=n2.socket, capabilities=["research"])
        verifier = Agent("verifier", socket=n3.socket, capabilities=["verify"])
        where = {"planner": n1.name, "researcher": n2.name, "verifier": n3.name}

        def at(name: str) -> str:
            return f"{name}@{where[name]}" if name in where else name

        thanks_arrived = asyncio.Event()
        thanks_got: list[Message] = []
        finding_arrived = asyncio.Event()
        findings_got: list[Message] = []
        clock: dict[str, float] = {}

        @verifier.on("verify")
        async def verify(msg: Message) -> dict[str, Any]:
            claim = str((msg.payload or {}).get("claim", "")).strip()
            if not claim:
                raise ValueError("empty claim")
            return {"verified": True, "by": at("verifier"), "claim": claim}

        @verifier.on(TOPIC)
        def on_finding(msg: Message) -> None:
            clock["finding"] = time.perf_counter()
            findings_got.append(msg)
            finding_arrived.set()

        @researcher.on("research")
        async def research(msg: Message) -> dict[str, Any]:
            question = str((msg.payload or {}).get("question", ""))
            claim = "meshd daemons find each other with zeroconf; there is no leader and no broker"
            t.step(at("researcher"), at("verifier"), "request", "verify", f"(nested, inside #{t.lines})",
                   {"claim": claim}, depth=1)
            start = time.perf_counter()
            checked = await verifier_request(researcher, claim)
            t.step(at("verifier"), at("researcher"), "reply", "verify", "", checked,
                   ms=ms_since(start), depth=1)
            return {"verified": bool(checked.get("verified")), "answer": claim, "question": question}

        @researcher.on("thanks")
        def on_thanks(msg: Message) -> None:
            clock["thanks"] = time.perf_counter()
            thanks_got.append(msg)
            thanks_arrived.set()

        async def verifier_request(agent: Agent, claim: str) -> dict[str, Any]:
            reply = await agent.request("verifier", "verify", {"claim": claim}, timeout=STEP_TIMEOUT)
            if not isinstance(reply, dict):
                raise DemoFailed(f"verifier replied {reply!r}, expected a map")
            return reply

        for agent in (planner, researcher, verifier):
            self.agents.append(agent)
            await self._bounded(f"attaching agent {agent.name}", agent.connect())
        await self._bounded(f"subscribing verifier to {TOPIC!r}", verifier.subscribe(TOPIC))
        await self._bounded("waiting for the directory to reach every daemon",
                            self._wait_directory(planner, researcher, verifier), MESH_TIMEOUT)
        self.say(f"  agents    {at('planner'):<18} asks the questions")
        self.say(f"            {at('researcher'):<18} handles \"research\" (and asks verifier), \"thanks\"")
        self.say(f"            {at('verifier'):<18} handles \"verify\"; subscribed to \"{TOPIC}\"")
        self.say()
        t.header()

        # 1. list the mesh
        start = time.perf_counter()
        listing = await self._bounded("planner lists agents", planner.agents())
        names = sorted(f"{a['name']}@{a.get('node_name', '?')}" for a in listing
                       if not str(a["name"]).startswith(PROBE_PREFIX))
        t.step(at("planner"), n1.name, "list", "agents",
               f"{len(names)} agents: " + ", ".join(names), ms=ms_since(start))

        # 2. request/reply, with a nested cross-daemon request inside the handler
        question = {"question": "how do meshd daemons find each other?"}
        t.step(at("planner"), at("researcher"), "request", "research", "", question)
        start = time.perf_counter()
        answer = await self._bounded("planner requests researcher",
                                     planner.request("researcher", "research", question,
                                                     timeout=STEP_TIMEOUT))
        t.step(at("researcher"), at("planner"), "reply", "research", "", answer, ms=ms_since(start))
        if not (isinstance(answer, dict) and answer.get("verified") is True):
            raise DemoFailed(f"the research reply was not a verified finding: {answer!r}")

        # 3. publish: returns how many subscribers it reached
        finding = {"finding": answer["answer"], "verified_by": at("verifier")}
        start = time.perf_counter()
        reached = await self._bounded("researcher publishes", researcher.publish(TOPIC, finding, reach=True))
        t.step(at("researcher"), "subscribers", "publish", TOPIC,
               f"reached {reached} subscriber(s):", finding, ms=ms_since(start))
        if reached != 1:
            raise DemoFailed(f"publish reached {reached} subscribers, expected 1 (verifier)")
        await self._bounded("verifier receives the publication", finding_arrived.wait())
        got = findings_got[0]
        t.step(at(got.sender), at("verifier"), "deliver", TOPIC,
               "subscriber's handler got", got.payload, ms=(clock["finding"] - start) * 1000)

        # 4. send: fire-and-forget; the handler records it, we wait for that
        note = {"note": "thanks, that settles it"}
        start = time.perf_counter()
        await self._bounded("planner sends thanks", planner.send("researcher", "thanks", note))
        await self._bounded("researcher receives the thanks", thanks_arrived.wait())
        t.step(at("planner"), at("researcher"), "send", "thanks",
               f"handler got (from {thanks_got[0].sender})", note, ms=(clock["thanks"] - start) * 1000)

        # 5. a typed error, fast: the local daemon knows there is no such agent
        t.step(at("planner"), "oracle", "request", "ask", "", {"question": "anyone there?"})
        start = time.perf_counter()
        try:
            await self._bounded("planner requests a missing agent",
                                planner.request("oracle", "ask", {"question": "anyone there?"},
                                                timeout=STEP_TIMEOUT))
        except NoSuchAgent as exc:
            t.step(n1.name, at("planner"), "error", "ask",
                   f"NoSuchAgent: {exc.message}", ms=ms_since(start))
        else:
            raise DemoFailed("a request to a missing agent did not raise NoSuchAgent")

        # 6. a handler that raises fails that one request, with the remote type
        t.step(at("planner"), at("verifier"), "request", "verify", "", {"claim": ""})
        start = time.perf_counter()
        try:
            await self._bounded("planner requests an invalid verification",
                                planner.request("verifier", "verify", {"claim": ""}, timeout=STEP_TIMEOUT))
        except HandlerError as exc:
            t.step(at("verifier"), at("planner"), "error", "verify",
                   f"HandlerError (remote {exc.remote_type}): {exc.message}", ms=ms_since(start))
        else:
            raise DemoFailed("a raising handler did not come back as HandlerError")

        # the raising handler took down neither the agent nor its daemon
        claim = "a handler's exception fails one request, not the agent"
        t.step(at("planner"), at("verifier"), "request", "verify", "", {"claim": claim})
        start = time.perf_counter()
        again = await self._bounded("verifier answers after its handler raised",
                                    verifier_request(planner, claim))
        t.step(at("verifier"), at("planner"), "reply", "verify", "still answering after the error:", again,
               ms=ms_since(start))
        for d in self.daemons:
            if d.exited() is not None:
                raise DemoFailed(f"meshd {d.name} exited with status {d.exited()} during the demo")

    async def _wait_directory(self, planner: Agent, researcher: Agent, verifier: Agent) -> None:
        """Every daemon lists all three agents, and node-2 knows verifier's subscription."""
        want = {"planner", "researcher", "verifier"}

        async def ready(agent: Agent) -> bool:
            records = {str(a["name"]): a for a in await agent.agents()}
            if not want <= set(records):
                return False
            return agent is not researcher or TOPIC in (records["verifier"].get("topics") or [])

        while not all([await ready(a) for a in (planner, researcher, verifier)]):  # noqa: ASYNC110 - polling the daemons
            await asyncio.sleep(0.05)

    async def run_async(self) -> None:
        await self.wait_mesh()
        try:
            await self.collaborate()
        finally:
            await asyncio.gather(*(a.close() for a in self.agents), return_exceptions=True)

    # ------------------------------------------------------------------ tear-down

    def cleanup(self) -> list[str]:
        self.current = "stopping the daemons"
        for d in self.daemons:
            d.sigterm()
        deadline = time.monotonic() + STOP_TIMEOUT
        ended = [f"{d.name} {d.wait_stopped(deadline)}" for d in self.daemons]
        if self.keep_logs:  # read now, printed at the very end
            self.logs = [(d.name, d.log_lines(0)) for d in self.daemons]
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return ended

    def footer(self, ended: list[str]) -> None:
        shown = sorted(set(self.t.primitives), key=self.t.primitives.index)
        say = self.say
        say()
        say("  ms: round trip for reply and error lines; until the receiving handler ran for send and")
        say("  deliver; until the daemon's answer for list and publish (measured with time.perf_counter).")
        say()
        say(f"Done in {time.perf_counter() - self.started:.1f} s. Shown across three daemons: "
            + ", ".join(shown) + ",")
        say("  a nested request (researcher asks verifier while answering planner), a fire-and-forget send")
        say("  confirmed by its handler, and typed errors that come back fast: NoSuchAgent, and HandlerError")
        say("  carrying the remote exception type, after which the agent keeps answering.")
        say(f"  Clean-up: {'; '.join(ended)}; temp dir removed.")
        say()
        say("Next steps:")
        say("  1. run a daemon of your own (--interface 127.0.0.1 keeps it on this host):")
        say(f"       meshd run --interface {LOOPBACK} --insecure --name my-node")
        say("  2. in another terminal, talk to it with meshctl:")
        say("       meshctl peers                 # the daemons it has found")
        say("       meshctl agents                # agents across the mesh")
        say("       meshctl agent echo --echo     # an agent that answers each request with its payload")
        say("       meshctl request echo hi '{\"text\": \"hello\"}'")
        say(f"       meshctl tail {TOPIC}         # then: meshctl publish {TOPIC} '{{\"x\": 1}}'")
        say("  3. write an agent with meshd.Agent (asyncio) or meshd.BlockingAgent: see README.md and docs/.")
        say("  meshd demo --keep-logs shows this run's daemon logs as well.")

    def print_logs(self) -> None:
        for name, text in self.logs:
            self.say(f"\n--- log of meshd {name} (--log-level info) ---")
            self.say(text.rstrip() or "(empty)")

    def print_log_tails(self) -> None:
        for d in self.daemons:
            self.say(f"\n--- last {LOG_TAIL_LINES} lines of meshd {d.name} ({d.log_path}) ---")
            self.say(d.log_lines() or "(empty)")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM to the demo cleans up like Ctrl-C does (main thread only)."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _quiet_client_logs() -> Iterator[None]:
    """The demo reports handler errors itself; keep the client's warnings out of the transcript."""
    logger = logging.getLogger("meshd.client")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def run_demo(keep_logs: bool = False) -> int:
    """Run the demo; returns the process exit status (0 ok, 1 a step failed, 130 interrupted)."""
    out = sys.stdout
    demo = Demo(out, keep_logs)
    status = 1
    error: str | None = None
    failed_at = ""
    with _sigterm_as_interrupt(), _quiet_client_logs():
        try:
            demo.start_daemons()
            asyncio.run(demo.run_async())
            status = 0
        except KeyboardInterrupt:
            status = 130
            error = f"interrupted while {demo.current}; cleaning up"
        except DemoFailed as exc:
            error = f"step failed while {demo.current}: {exc}"
        except MeshError as exc:
            error = f"step failed while {demo.current}: {type(exc).__name__} [{exc.code}]: {exc.message}"
        except Exception as exc:  # an unexpected failure still gets a clear message and clean-up
            error = f"step failed while {demo.current}: {type(exc).__name__}: {exc}"
        finally:
            failed_at = demo.current
            if error is not None:
                gone = [f"meshd {d.name} exited with status {d.exited()}" for d in demo.daemons
                        if d.exited() is not None]
                if gone and status == 1:
                    error += " (" + "; ".join(gone) + ")"
                print(f"\nmeshd demo: {error}", file=sys.stderr, flush=True)
                if status == 1:
                    demo.print_log_tails()
            try:
                ended = demo.cleanup()
            except KeyboardInterrupt:  # Ctrl-C during clean-up: be quick about it
                print("\nmeshd demo: interrupted while stopping the daemons: killing them",
                      file=sys.stderr, flush=True)
                for d in demo.daemons:
                    d.kill()
                if demo.workdir is not None:
                    shutil.rmtree(demo.workdir, ignore_errors=True)
                return 130
    if status == 0:
        demo.footer(ended)
    elif status == 1:
        print(f"meshd demo: FAILED while {failed_at}; clean-up: {'; '.join(ended)}; temp dir removed.",
              file=sys.stderr, flush=True)
    demo.print_logs()
    return status


__all__ = ["run_demo"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo(keep_logs="--keep-logs" in sys.argv[1:]))
