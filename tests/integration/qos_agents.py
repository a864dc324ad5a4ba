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

The second half of the file is the harness the qos-1 fault tests share (``Stream``: start the
two agent processes, wait, count, print the summary line). Every loop here is bounded in count
and time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshd import Agent
from meshd.errors import MeshError
from meshd.testing import connect_until, wait_until


async def _connect(args: argparse.Namespace, deadline: float,
                   setup: Callable[[Agent], None] = lambda agent: None) -> Agent:
    """Connect, retrying while the daemon is not there yet (bounded by ``deadline``); ``setup``
    registers handlers on each fresh agent before it connects."""
    def make() -> Agent:
        agent = Agent(args.name, socket=args.socket, heartbeat_interval=args.heartbeat)
        setup(agent)
        return agent

    return await connect_until(make, deadline)


def record_jobs(agent: Agent, out: Any, kill_at: int, kill_pid: int = 0) -> None:
    """The receiver's ``job`` handler: one line per message handled (``i a id``), and with
    ``kill_at`` >= 0 a SIGKILL (of ``kill_pid``, or this process) right after the handler for
    message ``kill_at`` ran. Fault injection at a known point: this handler has finished, its unit
    is not acked yet, and the rest of its batch may still be unhandled."""
    kill_pending = kill_at >= 0

    @agent.on("job")
    def job(msg: Any) -> None:
        nonlocal kill_pending
        p = msg.payload
        out.write(f"{p['i']} {p.get('a', 0)} {msg.id}\n")
        out.flush()
        if kill_pending and p["i"] >= kill_at:
            kill_pending = False
            os.kill(kill_pid or os.getpid(), signal.SIGKILL)


async def receiver(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    out = open(args.out, "a", buffering=1)  # noqa: SIM115, ASYNC230 - line buffered: one write per run
    # The handler before connecting: a restarted receiver gets the units waiting for it at once,
    # and one on a topic with no handler yet would be a dead letter, not a handled line (CI, with
    # a CPU hog beside: 10 of 2,000 were never handled that way).
    agent = await _connect(args, time.monotonic() + 30,
                           lambda fresh: record_jobs(fresh, out, args.kill_at, args.kill_pid))

    Path(args.out + ".ready").write_text(f"{agent.node}\n")  # noqa: ASYNC240 - once, tiny
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
    out = open(args.out, "a", buffering=1)  # noqa: SIM115, ASYNC230 - line buffered
    late_errors: dict[str, int] = {}  # errors for sends already confirmed (or unknown ids)

    def on_error(err: MeshError, corr: str | None) -> None:
        late_errors[err.code] = late_errors.get(err.code, 0) + 1

    agent.on_error = on_error
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

    async def one_round(todo: list[int]) -> list[int]:
        """Send ``todo`` through a sliding window: at most --window sends outstanding, a steady
        stream (no idle gaps between windows in which a kill would find nothing in flight)."""
        failed: list[int] = []
        window = asyncio.Semaphore(args.window)

        async def bounded(i: int) -> None:
            try:
                i, result = await one(i)
            finally:
                window.release()
            if isinstance(result, BaseException):
                failures[type(result).__name__] = failures.get(type(result).__name__, 0) + 1
                attempt[i] += 1
                failed.append(i)
            else:
                out.write(f"{i} {attempt[i]} {result:.6f}\n")

        tasks = []
        for n, i in enumerate(todo):
            await window.acquire()
            tasks.append(asyncio.create_task(bounded(i)))
            if args.pace and n % 10 == 9:
                await asyncio.sleep(args.pace)
        await asyncio.gather(*tasks)
        return sorted(failed)

    rounds = 0
    while todo and rounds < 200 and time.monotonic() < deadline:
        rounds += 1
        todo = await one_round(todo)
        if todo:
            await asyncio.sleep(0.5)  # the daemon restarts; the client registers again on its own
    out.close()
    print(f"sender: rounds={rounds} unconfirmed_sends={sum(failures.values())} {failures} "
          f"left={len(todo)} in {time.monotonic() - t_start:.2f} s", file=sys.stderr)
    print(f"late_errors={json.dumps(late_errors, sort_keys=True)}", file=sys.stderr)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(agent.close(), 3)
    return 0 if not todo else 1


# ------------------------------------------------------------------------------------ test harness
# Imported by tests/integration/test_qos1_faults.py and tests/multihost/test_qos1_netlab.py; the
# agent processes above never use it.

COUNT = 2000
# Shorter than the defaults (5 s, 3 attempts) so retries after a fault come within seconds:
# attempts at 1, 2, 4, ... s (doubling) give up only after ~17 minutes; the ttl of a day keeps
# anything from becoming a dead letter during a test.
QOS_ENV = {"MESHD_QOS1_ACK_TIMEOUT": "1", "MESHD_QOS1_ATTEMPTS": "10", "MESHD_QOS1_TTL": "86400"}
PACE = "0.005"  # seconds after every 10 sends: a steady stream of ~1.5 s, so a fault lands mid-flight


def read_handled(path: Path) -> list[tuple[int, int]]:
    """One (i, attempt) per handler run."""
    if not path.exists():
        return []
    runs = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # one write per line: kill -9 cannot leave half a line
            runs.append((int(parts[0]), int(parts[1])))
    return runs


def read_confirmed(path: Path) -> dict[tuple[int, int], float]:
    """(i, attempt) -> seconds from send to the daemon's confirmation."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[(int(parts[0]), int(parts[1]))] = float(parts[2])
    return out


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def dead_letters(proc: Any) -> list[dict[str, Any]]:
    """The daemon's dead letters (``proc`` is a meshd.testing.MeshdProcess)."""
    return list(proc.dead_letters())


def agent_listed(proc: Any, name: str) -> bool:
    try:
        return any(a["name"] == name for a in proc.query("agents"))
    except Exception:
        return False


class Stream:
    """A receiving agent process on daemon ``b``, a sending one on daemon ``a``, their files.

    ``a`` and ``b`` are meshd.testing.MeshdProcess objects (or subclasses). The counters of the
    daemons are taken at creation, so daemons shared by several streams report per stream.
    """

    def __init__(self, a: Any, b: Any, workdir: Path, tag: str = "", count: int = COUNT,
                 pace: str = PACE) -> None:
        self.a, self.b, self.workdir, self.count, self.pace = a, b, workdir, count, pace
        self.rx, self.tx = f"rx{tag}", f"tx{tag}"
        self.recv_out = workdir / f"handled{tag}.txt"
        self.sent_out = workdir / f"confirmed{tag}.txt"
        self.logs = {role: workdir / f"{role}{tag}.log" for role in ("receiver", "sender")}
        self.receiver: subprocess.Popen[bytes] | None = None
        self.sender: subprocess.Popen[bytes] | None = None
        self.started: list[subprocess.Popen[bytes]] = []
        self.notes: list[str] = []
        self.base_b = dict(b.query("node").get("qos1", {}))
        self.base_letters = {p.name: max((d["seq"] for d in dead_letters(p)), default=0) for p in (a, b)}

    # -------------------------------------------------------------------------- processes

    def start_receiver(self, *extra: str) -> None:
        ready = Path(str(self.recv_out) + ".ready")
        ready.unlink(missing_ok=True)
        self.receiver = proc = self._popen("receiver", "--socket", str(self.b.socket), "--name", self.rx,
                                           "--out", str(self.recv_out), *extra)
        wait_until(lambda: ready.exists() or proc.poll() is not None, 15, what="the receiving agent")
        assert proc.poll() is None, self.agent_log("receiver")

    def start_sender(self, *extra: str) -> None:
        self.sender = self._popen("sender", "--socket", str(self.a.socket), "--name", self.tx,
                                  "--to", self.rx, "--count", str(self.count), "--out", str(self.sent_out),
                                  "--pace", self.pace, *extra)

    def _popen(self, role: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.logs[role], "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen([sys.executable, __file__, role, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        self.started.append(proc)
        return proc

    def agent_log(self, role: str) -> str:
        try:
            return self.logs[role].read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def wait_handled(self, n: int, timeout: float = 20.0) -> None:
        wait_until(lambda: count_lines(self.recv_out) >= n, timeout, what=f"{n} handler runs", interval=0.005)

    def wait_confirmed(self, n: int, timeout: float = 20.0) -> None:
        wait_until(lambda: count_lines(self.sent_out) >= n, timeout, what=f"{n} confirmed sends",
                   interval=0.005)

    def cleanup(self) -> None:
        for proc in self.started:  # only the agent processes this stream started
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # in case a test left it stopped
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)

    # -------------------------------------------------------------------------- results

    def finish(self, scenario: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for the sender to exit, for every confirmed message to be handled and for a's
        outbox to drain (so late duplicates are counted too); print and return the summary."""
        assert self.sender is not None
        try:
            rc = self.sender.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, f"sender exited with {rc}:\n{self.agent_log('sender')}"

        def all_handled() -> bool:
            return set(read_confirmed(self.sent_out)) <= set(read_handled(self.recv_out))

        try:
            wait_until(all_handled, timeout, what="every confirmed message handled", interval=0.1)
        except TimeoutError:  # say what each side holds, for whoever reads the failure
            missing = sorted(set(read_confirmed(self.sent_out)) - set(read_handled(self.recv_out)))
            print("diagnostics: confirmed, never handled:", len(missing), missing[:20], file=sys.stderr)
            for p in (self.a, self.b):
                try:
                    info = p.query("node")
                    print("diagnostics:", p.name, "qos1", info.get("qos1"), file=sys.stderr)
                    print("diagnostics:", p.name, "stats", info.get("stats"), file=sys.stderr)
                    print("diagnostics:", p.name, "agents", p.query("agents"), file=sys.stderr)
                except Exception as exc:
                    print("diagnostics: query failed", p.name, exc, file=sys.stderr)
            print("diagnostics: receiver log:\n", self.agent_log("receiver"), file=sys.stderr)
            raise
        wait_until(lambda: self.a.query("node")["qos1"]["pending"] == 0, timeout,
                   what="the sending daemon's outbox to drain", interval=0.1)
        time.sleep(0.3)  # acks and suppressed retries in flight
        return self.summary(scenario)

    def summary(self, scenario: str) -> dict[str, Any]:
        runs = read_handled(self.recv_out)
        confirmed = read_confirmed(self.sent_out)
        per_msg = Counter(runs)
        handled_i = {i for i, _ in per_msg}
        lost = set(confirmed) - set(per_msg)
        qos_a = self.a.query("node")["qos1"]
        qos_b = self.b.query("node")["qos1"]
        if qos_b.get("commits", 0) < self.base_b.get("commits", 0):
            self.base_b = {}  # b restarted: its counters started again from zero
        suppressed = sum(int(qos_b.get(k, 0)) - int(self.base_b.get(k, 0))
                         for k in ("dup_suppressed", "dup_in_flight"))
        letters = {p.name: [d for d in dead_letters(p) if d["seq"] > self.base_letters.get(p.name, 0)]
                   for p in (self.a, self.b)}
        lat = list(confirmed.values())
        late = [json.loads(line.partition("=")[2]) for line in self.agent_log("sender").splitlines()
                if line.startswith("late_errors=")]
        stats = {
            "sent": self.count, "handled": len(handled_i), "lost": len(lost),
            "dup_delivered": sum(n - 1 for n in per_msg.values()), "dup_suppressed": suppressed,
            "p50": percentile(lat, 0.50) * 1000, "p99": percentile(lat, 0.99) * 1000,
            "unconfirmed": sum(a for (_, a) in confirmed),  # every earlier attempt of an index failed
            "unconfirmed_handled": len(set(per_msg) - set(confirmed)),
            "missing_i": sorted(set(range(self.count)) - handled_i)[:20], "lost_ids": sorted(lost)[:20],
            "dead_letters": letters, "late_errors": late[-1] if late else None,
        }
        print(f"\n[qos1 {scenario}] sent={stats['sent']} handled={stats['handled']} lost={stats['lost']} "
              f"dup_delivered={stats['dup_delivered']} dup_suppressed={suppressed} "
              f"p50={stats['p50']:.1f}ms p99={stats['p99']:.1f}ms unconfirmed={stats['unconfirmed']} "
              f"unconfirmed_handled={stats['unconfirmed_handled']}"
              + (f" notes={'; '.join(self.notes)}" if self.notes else ""))
        kinds = {name: dict(Counter(f"{d['reason']}/{d['kind']}/qos{(d.get('header') or {}).get('qos', 0)}"
                                    for d in ls)) for name, ls in letters.items()}
        print(f"  errors the sending agent got outside a send call: {stats['late_errors']}")
        print(f"  new dead letters: {kinds}; a qos1={qos_a}; b qos1={qos_b}")
        return stats


def check(stats: dict[str, Any], max_dup: int) -> None:
    """Every confirmed message handled, every index handled, duplicates within ``max_dup``; no
    dead letters (the ttl is a day) and no error reported for a message that was delivered."""
    assert stats["lost"] == 0, f"confirmed but never handled: {stats['lost_ids']}"
    assert stats["handled"] == stats["sent"], f"indexes never handled: {stats['missing_i']}"
    assert stats["dup_delivered"] <= max_dup, stats
    assert not any(stats["dead_letters"].values()), f"dead letters: {stats['dead_letters']}"
    # NOT_REGISTERED while the client registers again after a daemon restart is its own business.
    late = {code: n for code, n in (stats["late_errors"] or {}).items() if code != "NOT_REGISTERED"}
    assert stats["late_errors"] is not None and not late, f"errors for confirmed sends: {late}"


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
