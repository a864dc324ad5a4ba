"""meshd benchmark: the daemon path measured side by side with raw pyzmq, in one run.

    .venv/bin/python bench/bench.py [--quick] [--json out.json]

Scenarios (see bench/README.md):
  (a) raw pyzmq DEALER->ROUTER over tcp 127.0.0.1: one-way msgs/s, and request/reply p50/p99
  (b) meshd one way: Agent -> daemon A -> daemon B -> Agent
  (c) meshd request/reply round trip through two daemons
  (d) meshd publish to 4 subscribers on the other daemon
  (e) as (b), but the sender is a raw DEALER sending pre-encoded batches in the local protocol
  (f) as (e), and the receiver is a raw DEALER too (daemons only, both ends raw; informational)
  (g) as (b) with send(..., qos=1), windows of sends in flight: qos 1 / qos 0, losses, commits
  (h) (b) and (c) again between two daemons with CurveZMQ on: CURVE / plaintext
  discovery of a newly started daemon (both ways) and staleness of a SIGKILLed one.

Every process is a separate OS process (2 daemons, 2 more with CURVE for (h), + helper processes
that this file runs with ``--role``, see roles.py). Helpers talk to the orchestrator with JSON
lines on stdin/stdout. Every daemon binds 127.0.0.1 only, in a mesh named uniquely for this run;
every loop is bounded in count and time; every process started here is killed (by PID) in a
finally block.

This file is the orchestrator (class Bench) and the entry point; procs.py starts and ends the
processes, roles.py is what the helpers run, table.py builds the summary table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import zmq
from common import SIG, TAIL_CAP_S, TAIL_IDLE_S, payload_size
from http_bench import http_rows
from http_bench import print_rows as print_http_rows
from procs import Daemon, Helper, cpu_meter, end
from roles import run_role
from table import build_table, print_table

QOS1_WINDOW = 512  # (g): qos-1 sends in flight at once (one asyncio.gather per window) ...
QOS1_LANES = 2  # ... in this many concurrent lanes (so 1024 in flight)


@dataclass
class Run:
    """What one throughput run collected (see Bench._drive)."""

    sent: int
    ready: dict[str, Any]  # the sender's "ready" event
    sent_ev: dict[str, Any]  # its "sent" event (raw_source: its only report, "result")
    final: dict[str, Any]  # its "result" event
    got: list[dict[str, Any]]  # each receiver's "result"
    cpu: dict[str, float]  # CPU seconds per daemon during the run
    go_at: float  # time.perf_counter() when the sender was told to go

    def at_receivers(self) -> dict[str, Any]:
        """The receiver-side figures. The run's rate is the slowest receiver's end to end: what it
        received over the time from the sender's "go" to its last arrival (perf_counter is
        CLOCK_MONOTONIC, one clock for every process on the host). A receiver's own window
        (first to last arrival, "window_rates") overstates it when messages queue up before the
        first one arrives: a sender whose loop runs ahead of its socket delivers in a burst."""
        sent, got = self.sent, self.got
        e2e = [g["received"] / (g["last"] - self.go_at) if g.get("last", 0) > self.go_at else 0.0
               for g in got]
        return {
            "received": [g["received"] for g in got], "rates": e2e,
            "window_rates": [g["rate"] for g in got],
            "lost": [sent - g["received"] for g in got], "rate": min(e2e),
            "lost_total": sum(sent - g["received"] for g in got), "daemon_cpu_s": self.cpu,
            "daemon_cpu_us_per_msg": {k: v * 1e6 / sent for k, v in self.cpu.items()} if sent else {},
            # each receiver's own CPU per message, between its first and last arrival
            "receiver_cpu_us_per_msg": [g.get("cpu_us_per_msg") for g in got],
        }


class Bench:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.duration = 1.5 if quick else 3.0
        self.reps = 1 if quick else 2
        self.rtt_cfg = {"n": 1000 if quick else 2000, "warmup": 200, "max_time": 20}
        # Raw-wire senders outrun the daemons: what is queued sits in zmq buffers, so bound it.
        self.wire_max_n = 1_000_000
        self.max_n = 3_000_000  # every other sender stops after this many (or the duration)
        self.workdir = Path(tempfile.mkdtemp(prefix="mshb-", dir="/tmp"))
        self.logdir = self.workdir / "logs"
        self.logdir.mkdir()
        self.mesh = f"bench{uuid.uuid4().hex[:10]}"
        self.daemons: list[Daemon] = []
        self.helpers: list[Helper] = []
        self.results: dict[str, Any] = {}
        self._n = 0

    # ----------------------------------------------------------------- process bookkeeping

    def helper(self, role: str, **cfg: Any) -> Helper:
        self._n += 1
        h = Helper(role, cfg, self.logdir, f"{self._n:02d}-{role}")
        self.helpers.append(h)
        return h

    def ready_helper(self, role: str, **cfg: Any) -> Helper:
        """A helper, once it has reported ready (so the next one can find it)."""
        h = self.helper(role, **cfg)
        h.wait("ready", 30)
        return h

    def daemon(self, name: str, mesh: str | None = None, secure: bool = False,
               env: dict[str, str] | None = None) -> Daemon:
        d = Daemon(name, mesh or self.mesh, self.workdir, secure, env=env)
        self.daemons.append(d)
        return d

    def cleanup(self) -> None:
        for h in self.helpers:
            with contextlib.suppress(Exception):
                end(h.proc)
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop()
        if os.environ.get("BENCH_KEEP"):
            print(f"logs kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ----------------------------------------------------------------- throughput runs

    def _drive(self, sender: Helper, receivers: list[Helper], daemons: tuple[Daemon, ...],
               ready_timeout: float = 30) -> Run:
        """The part every throughput run shares: go; once the sender is done, tell each receiver
        how many to expect; collect; stop and reap every helper of the run."""
        for r in receivers:
            r.wait("ready", 30)
        ready = sender.wait("ready", ready_timeout)
        if sender.cfg.get("warm"):  # NATS, Zenoh, PUB/SUB: go once every receiver heard the warm-up
            for r in receivers:
                r.wait("warmed", 20)
        cpu = cpu_meter(daemons)
        go_at = time.perf_counter()
        sender.send(cmd="go")
        # raw_source reports once ("result"); the others report "sent", and "result" on "stop".
        one_report = sender.role == "raw_source"
        # A sender's own duration (the soak's --soak-s) may be longer than the runs' duration.
        duration = max(self.duration, float(sender.cfg.get("duration") or 0))
        sent_ev = sender.wait("result" if one_report else "sent", duration + 30)
        sent = int(sent_ev["sent"])
        for r in receivers:
            r.send(cmd="expect", n=sent, idle=TAIL_IDLE_S, cap=TAIL_CAP_S)
        got = [r.wait("result", TAIL_CAP_S + 10) for r in receivers]
        used = cpu()
        if not one_report:
            sender.send(cmd="stop")
        final = sender.wait("result", 15)
        for h in [sender, *receivers]:
            h.finish()
        return Run(sent, ready, sent_ev, final, got, used, go_at)

    def one_way(self, label: str, receivers: list[Helper], sender: Helper,
                daemons: tuple[Daemon, ...] = ()) -> dict[str, Any]:
        run = self._drive(sender, receivers, daemons)
        s, f = run.sent_ev, run.final
        out = {
            "sent": run.sent, "send_rate": s["rate"], "send_elapsed_s": s["elapsed_s"],
            "sender_errors": f.get("errors", 0), "error_codes": f.get("error_codes", {}),
            "send_failed": f.get("send_failed", 0), "dups": [g.get("dups", 0) for g in run.got],
            "sender_cpu_us_per_msg": s.get("cpu_us_per_msg"), **run.at_receivers(),
        }
        per = ", ".join(f"{k} {v:.1f}" for k, v in out["daemon_cpu_us_per_msg"].items())
        if out["sender_cpu_us_per_msg"] is not None:
            per += f"; sender (client) CPU us/msg {out['sender_cpu_us_per_msg']:.1f}"
        recv_cpu = [c for c in out["receiver_cpu_us_per_msg"] if c is not None]
        if recv_cpu:
            per += "; receiver CPU us/msg " + " / ".join(f"{c:.1f}" for c in recv_cpu)
        print(f"  {label}: {out['rate']:,.0f} msgs/s end to end (sender {out['send_rate']:,.0f}, "
              f"receiver's own window {min(out['window_rates']):,.0f}), "
              f"sent {run.sent:,}, lost {out['lost_total']:,}, sender errors {out['sender_errors']}"
              + (f"; daemon CPU us/msg: {per}" if per else ""), flush=True)
        return out

    def a_to_b(self, label: str, a: Daemon, b: Daemon, tag: str, prefix: str, recv_role: str,
               recv_cfg: dict[str, Any], send_role: str, **send_cfg: Any) -> dict[str, Any]:
        """One-way from an agent on daemon ``a`` to ``{prefix}recv-{tag}`` on daemon ``b``; the
        receiver is ready before the sender starts, so the sender finds it in the directory."""
        name = f"{prefix}recv-{tag}"
        recv = self.ready_helper(recv_role, name=name, socket=str(b.socket), **recv_cfg)
        snd = self.helper(send_role, name=f"{prefix}send-{tag}", socket=str(a.socket), to=name,
                          duration=self.duration, **send_cfg)
        return self.one_way(label, [recv], snd, daemons=(a, b))

    def best(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """Best of the repetitions by rate; losses summed over all of them."""
        top = dict(max(runs, key=lambda r: r["rate"]))
        top["all_rates"] = [r["rate"] for r in runs]
        top["runs"] = [{k: v for k, v in r.items() if k != "runs"} for r in runs]
        top["lost_all_runs"] = sum(r["lost_total"] for r in runs)
        top["sender_errors_all_runs"] = sum(r["sender_errors"] for r in runs)
        return top

    # ----------------------------------------------------------------- scenarios

    def raw_throughput(self) -> dict[str, Any]:
        sink = self.ready_helper("raw_sink")
        src = self.helper("raw_source", endpoint=sink.seen["ready"]["endpoint"], max_n=self.max_n,
                          duration=self.duration)
        return self.one_way("(a) raw pyzmq one-way", [sink], src)

    def mesh_throughput(self, a: Daemon, b: Daemon, tag: str,
                        label: str = "(b) meshd one-way") -> dict[str, Any]:
        return self.a_to_b(label, a, b, tag, "", "mesh_recv", {"topic": "bench"}, "mesh_send",
                           max_n=3_000_000)

    def qos1_throughput(self, a: Daemon, b: Daemon, tag: str) -> dict[str, Any]:
        """(g) as (b) with ``send(..., qos=1)``, QOS1_WINDOW sends in flight (one gather each)."""
        before = {d.name: self._node_info(d).get("qos1", {}) for d in (a, b)}
        out = self.a_to_b("(g) meshd qos 1 one-way", a, b, tag, "q1", "mesh_recv",
                          {"topic": "bench", "dedupe": True}, "mesh_send", max_n=3_000_000,
                          qos=1, window=QOS1_WINDOW, lanes=QOS1_LANES)
        # Wait (bounded) until daemon A's outbox is empty: every unit acked, its delete committed.
        end_at = time.monotonic() + 10
        after: dict[str, dict[str, Any]] = {}
        while True:
            after = {d.name: self._node_info(d).get("qos1", {}) for d in (a, b)}
            if after[a.name].get("pending", 1) == 0 or time.monotonic() > end_at:
                break
            time.sleep(0.05)
        delta = {n: {k: v - before[n].get(k, 0) for k, v in after[n].items()
                     if isinstance(v, int) and k not in ("pending", "in_flight")} for n in after}
        out["qos1"] = {"window": QOS1_WINDOW, "lanes": QOS1_LANES, "delta": delta,
                       "pending_after": {n: after[n].get("pending") for n in after}}
        commits = delta[a.name].get("commits", 0)
        units = delta[a.name].get("accepted", 0)
        out["a_commits"] = commits
        out["a_units"] = units
        out["msgs_per_a_commit"] = out["sent"] / commits if commits else 0.0
        out["dups_total"] = sum(out["dups"])
        print(f"    qos 1: daemon A {commits:,} commits for {out['sent']:,} messages in {units:,} units "
              f"({out['msgs_per_a_commit']:.0f} msgs per commit; B {delta[b.name].get('commits', 0):,} "
              f"commits); duplicates at the receiver {out['dups_total']}, sends failed "
              f"{out['send_failed']}, A outbox left {after[a.name].get('pending')}", flush=True)
        return out

    def wire_throughput(self, a: Daemon, b: Daemon, tag: str, raw_receiver: bool) -> dict[str, Any]:
        if raw_receiver:
            label, recv_role, recv_cfg = "(f) raw wire both ends", "wire_recv", {}
        else:
            label, recv_role, recv_cfg = "(e) raw wire sender -> Agent", "mesh_recv", {"topic": "bench"}
        return self.a_to_b(label, a, b, tag, "w", recv_role, recv_cfg, "wire_send",
                           max_n=self.wire_max_n, batch=64)

    def _subscribers(self, b: Daemon, prefix: str, tag: str, n_subs: int) -> tuple[str, list[Helper]]:
        """``n_subs`` subscriber Agents on daemon ``b``, ready; and their topic."""
        topic = f"{prefix}pub-{tag}"
        return topic, [self.ready_helper("mesh_recv", name=f"{prefix}sub{k}-{tag}", socket=str(b.socket),
                                         topic=topic, subscribe=True) for k in range(n_subs)]

    def mesh_publish(self, a: Daemon, b: Daemon, tag: str, n_subs: int = 4) -> dict[str, Any]:
        topic, subs = self._subscribers(b, "", tag, n_subs)
        pub = self.helper("mesh_pub", name=f"pub-{tag}", socket=str(a.socket), topic=topic,
                          subscribers=n_subs, window=256, max_n=3_000_000, duration=self.duration)
        run = self._drive(pub, subs, (a, b), ready_timeout=40)
        out = {
            "sent": run.sent, "publish_rate": run.sent_ev["rate"], "reached_at_warmup": run.ready["reached"],
            "reached_hist": run.sent_ev["reached_hist"], "publisher_errors": run.final["errors"],
            "sender_errors": run.final["errors"], **run.at_receivers(),
        }
        print(f"  (d) meshd publish: {out['publish_rate']:,.0f} publishes/s, per subscriber "
              f"{', '.join(f'{r:,.0f}' for r in out['rates'])} msgs/s, lost {out['lost']}, "
              f"reached {out['reached_hist']}", flush=True)
        return out

    def wire_publish(self, a: Daemon, b: Daemon, tag: str, n_subs: int = 4) -> dict[str, Any]:
        """(d') as (d), the publisher a raw DEALER sending pre-encoded publish batches."""
        topic, subs = self._subscribers(b, "w", tag, n_subs)
        pub = self.helper("wire_send", name=f"wpub-{tag}", socket=str(a.socket), topic=topic,
                          subscribers=n_subs, max_n=self.wire_max_n, duration=self.duration, batch=64)
        out = self.one_way("(d') raw wire publisher -> 4 Agents", subs, pub, daemons=(a, b))
        out["daemon_b_stats"] = self._daemon_stats(b)
        return out

    # ----------------------------------------------------------------- request/reply runs

    def _rtt(self, label: str, rtt: Helper, servers: list[Helper],
             daemons: tuple[Daemon, ...] = ()) -> dict[str, Any]:
        """Time ``rtt``'s sequential requests against the (ready) ``servers``; stop and reap all."""
        rtt.wait("ready", 30)
        cpu = cpu_meter(daemons)
        rtt.send(cmd="go")
        res = rtt.wait("result", 40)
        if daemons:
            res["daemon_cpu_s"] = cpu()
        self._end_rtt(rtt, servers)
        print(f"  {label}: p50 {res['p50_us']:.0f} us, p99 {res['p99_us']:.0f} us", flush=True)
        return res

    @staticmethod
    def _end_rtt(rtt: Helper, servers: list[Helper]) -> None:
        """Stop the echo servers of a request/reply row (each reports once) and reap all helpers."""
        for s in servers:
            s.send(cmd="stop")
        for s in servers:
            s.wait("result", 10)
        for h in (rtt, *servers):
            h.finish()

    def raw_rtt(self) -> dict[str, Any]:
        echo = self.ready_helper("raw_echo")
        rtt = self.helper("raw_rtt", endpoint=echo.seen["ready"]["endpoint"], **self.rtt_cfg)
        return self._rtt("(a) raw pyzmq rtt", rtt, [echo])

    def relay_rtt(self) -> dict[str, Any]:
        """Request/reply through two minimal pyzmq relays (same 6 hops as meshd)."""
        ra = self.helper("raw_relay", ipc=str(self.workdir / "ra.sock"))
        rb = self.helper("raw_relay", ipc=str(self.workdir / "rb.sock"))
        ea, eb = ra.wait("ready", 30)["endpoint"], rb.wait("ready", 30)["endpoint"]
        ra.send(peer=eb)
        rb.send(peer=ea)
        echo = self.ready_helper("raw_echo_dealer", endpoint=f"ipc://{self.workdir / 'rb.sock'}")
        rtt = self.helper("raw_rtt", endpoint=f"ipc://{self.workdir / 'ra.sock'}", **self.rtt_cfg)
        return self._rtt("(c'') raw pyzmq 2-relay rtt", rtt, [echo, ra, rb])

    def mesh_rtt(self, a: Daemon, b: Daemon, wire: bool = False, label: str = "") -> dict[str, Any]:
        kind = "wire" if wire else "mesh"
        echo = self.ready_helper(f"{kind}_echo", name=f"echo-{kind}", socket=str(b.socket))
        rtt = self.helper(f"{kind}_rtt", name=f"asker-{kind}", socket=str(a.socket), to=f"echo-{kind}",
                          **self.rtt_cfg)
        label = label or ("(c') raw wire rtt" if wire else "(c) meshd rtt")
        return self._rtt(label, rtt, [echo], daemons=(a, b))

    # ----------------------------------------------------------------- daemons: CURVE, discovery, liveness

    def secure_pair(self) -> tuple[Daemon, Daemon, dict[str, Any]]:
        """Two daemons with CurveZMQ on (trust_mode keys), trusting each other's node key."""
        from meshd.mesh.keys import load_or_create_node_keys, trust_key

        mesh = f"{self.mesh}s"  # a mesh of their own: they never meet the plaintext pair
        sa, sb = self.daemon("SA", mesh, secure=True), self.daemon("SB", mesh, secure=True)
        ka, kb = load_or_create_node_keys(sa.state_dir), load_or_create_node_keys(sb.state_dir)
        trust_key(sa.state_dir / "authorized_keys", sb.name, kb.public)
        trust_key(sb.state_dir / "authorized_keys", sa.name, ka.public)
        sa.start()
        sa.wait_ready()
        disc = asyncio.run(self.discovery(sa, sb))
        if "new_sees_old_ms" not in disc or "old_sees_new_ms" not in disc:
            raise RuntimeError(f"CURVE daemons SA and SB never saw each other:\n{sa.log()}\n{sb.log()}")
        for d in (sa, sb):
            info = self._node_info(d)
            if info.get("insecure") or not info.get("public_key"):
                raise RuntimeError(f"daemon {d.name} is not in secure mode: {info}")
        return sa, sb, disc

    async def _probe(self, d: Daemon, name: str) -> Any:
        from meshd.client import Agent

        agent = Agent(name, socket=str(d.socket))
        await agent.connect()
        return agent

    @staticmethod
    async def _peer_state(agent: Any, node_id: str) -> str | None:
        return {p["node"]: p["state"] for p in await agent.peers()}.get(node_id)

    async def _watch(self, agent: Any, node_id: str, online: bool, t0: float,
                     end_at: float) -> tuple[float, str | None] | None:
        """Poll ``agent.peers()`` every 5 ms until ``node_id`` is (not) online, as ``online`` says;
        (ms since t0, its state), or None at ``end_at``."""
        while time.monotonic() < end_at:
            state = await self._peer_state(agent, node_id)
            if (state == "online") == online:
                return (time.monotonic() - t0) * 1000, state
            await asyncio.sleep(0.005)
        return None

    async def discovery(self, old: Daemon, new: Daemon, timeout: float = 10.0) -> dict[str, Any]:
        """Start ``new``; time until old lists new online, and new lists old online."""
        pa = await self._probe(old, f"probe-{new.name}-old")
        out: dict[str, Any] = {}
        try:
            new.start()
            t0 = new.spawned_at

            async def old_side() -> None:
                seen = await self._watch(pa, new.node_id, True, t0, t0 + timeout)
                if seen:
                    out["old_sees_new_ms"] = seen[0]

            async def new_side() -> None:
                while not new.socket.exists() and time.monotonic() < t0 + timeout:  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
                out["new_ready_ms"] = (time.monotonic() - t0) * 1000
                pb = await self._probe(new, f"probe-{new.name}-new")
                try:
                    seen = await self._watch(pb, old.node_id, True, t0, t0 + timeout)
                    if seen:
                        out["new_sees_old_ms"] = seen[0]
                finally:
                    await pb.close()

            await asyncio.wait_for(asyncio.gather(old_side(), new_side()), timeout + 5)
        finally:
            await pa.close()
        out["both_ways_ms"] = max(out.get("old_sees_new_ms", float("inf")),
                                  out.get("new_sees_old_ms", float("inf")))
        out["after_ready_ms"] = out["both_ways_ms"] - out.get("new_ready_ms", 0.0)
        print(f"  discovery {old.name}<->{new.name}: new daemon ready (socket bound) after "
              f"{out.get('new_ready_ms', float('nan')):.0f} ms; {old.name} sees it online at "
              f"{out.get('old_sees_new_ms', float('inf')):.0f} ms, it sees {old.name} at "
              f"{out.get('new_sees_old_ms', float('inf')):.0f} ms (from process start)", flush=True)
        return out

    async def stale_after_kill(self, observer: Daemon, victim: Daemon,
                               timeout: float = 15.0) -> dict[str, Any]:
        pa = await self._probe(observer, f"probe-kill-{victim.name}")
        out: dict[str, Any] = {}
        try:
            assert await self._peer_state(pa, victim.node_id) == "online", "victim not online before the kill"
            assert victim.proc is not None
            t0 = time.monotonic()
            victim.proc.send_signal(signal.SIGKILL)
            seen = await self._watch(pa, victim.node_id, False, t0, t0 + timeout)
            if seen:
                out["stale_ms"], out["state"] = seen
            victim.proc.wait(5)
        finally:
            await pa.close()
        print(f"  SIGKILL {victim.name}: {observer.name} sees it {out.get('state')} after "
              f"{out.get('stale_ms', float('inf')):.0f} ms", flush=True)
        return out

    def _node_info(self, d: Daemon, probe: str = "probe-info") -> dict[str, Any]:
        """The daemon's whole ``node_info()`` (asked by a probe Agent); {"error": ...} if it
        cannot answer (the figures that need it are informational)."""
        async def ask() -> Any:
            agent = await self._probe(d, probe)
            try:
                return await agent.node_info()
            finally:
                await agent.close()
        try:
            return dict(asyncio.run(ask()))
        except Exception as exc:
            return {"error": str(exc)}

    def _daemon_stats(self, d: Daemon) -> dict[str, Any]:
        info = self._node_info(d, "probe-stats")
        return info if "error" in info else dict(info.get("stats", {}))

    # ----------------------------------------------------------------- the run

    def guarded(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one scenario; a failure is recorded (and shown as ERROR) instead of ending the run."""
        try:
            return fn(*args)
        except Exception as exc:
            print(f"  {key}: FAILED: {type(exc).__name__}: {str(exc)[:600]}", flush=True)
            self.results.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"
            return None

    def repeat(self, key: str, fn: Callable[..., Any], *args: Any, reps: int | None = None) -> None:
        runs = [self.guarded(key, fn, *args, f"{key}{k}") for k in range(reps or self.reps)]
        runs = [x for x in runs if x is not None]
        if runs:
            self.results[key] = self.best(runs)

    def run(self) -> dict[str, Any]:
        r = self.results
        r["meta"] = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(), "pyzmq": zmq.__version__,
            "libzmq": zmq.zmq_version(), "msgpack": ".".join(map(str, msgpack.version)),
            "payload_bytes": payload_size(), "quick": self.quick, "duration_s": self.duration,
            "reps": self.reps, "mesh": self.mesh, "loadavg_at_start": os.getloadavg(),
        }
        print(f"meshd bench: payload {r['meta']['payload_bytes']} bytes, {self.duration:g} s per "
              f"throughput run, best of {self.reps}; mesh {self.mesh}", flush=True)

        from meshd.wire import protocol as P
        if P.SIGNATURE != SIG:
            raise RuntimeError(f"bench SIG {SIG!r} != meshd.wire.protocol.SIGNATURE {P.SIGNATURE!r}")

        a = self.daemon("A")
        a.start()
        r["daemon_a_ready_ms"] = a.wait_ready() * 1000
        b = self.daemon("B")
        disc = [asyncio.run(self.discovery(a, b))]
        if "new_sees_old_ms" not in disc[0] or "old_sees_new_ms" not in disc[0]:
            raise RuntimeError(f"daemons A and B never saw each other:\n{a.log()}\n{b.log()}")

        print("raw pyzmq:", flush=True)
        raw_tp = [x for x in (self.guarded("raw_tp", self.raw_throughput) for _ in range(self.reps)) if x]
        r["raw_rtt"] = self.guarded("raw_rtt", self.raw_rtt)
        r["relay_rtt"] = self.guarded("relay_rtt", self.relay_rtt)
        print("meshd (CURVE pair SA, SB started first):", flush=True)
        secure = self.guarded("curve_daemons", self.secure_pair)
        if secure:
            r["curve_discovery"] = secure[2]
        # (b) qos 0, (g) qos 1 and (h) CURVE one-way interleaved, so that their ratios compare
        # runs made under the same background load.
        tp_runs: dict[str, list[dict[str, Any] | None]] = {"mesh_tp": [], "qos1_tp": [], "curve_tp": []}
        for k in range(self.reps):
            tp_runs["mesh_tp"].append(self.guarded("mesh_tp", self.mesh_throughput, a, b, f"mesh_tp{k}"))
            tp_runs["qos1_tp"].append(self.guarded("qos1_tp", self.qos1_throughput, a, b, f"qos1_tp{k}"))
            if secure:
                tp_runs["curve_tp"].append(self.guarded(
                    "curve_tp", self.mesh_throughput, secure[0], secure[1], f"curve_tp{k}",
                    "(h) CURVE one-way"))
        for key, runs in tp_runs.items():
            done = [x for x in runs if x is not None]
            if done:
                r[key] = self.best(done)
        # Per repetition: the ratio of two runs made back to back (the table's ratio is best/best).
        r["pair_ratios"] = {
            name: [x["rate"] / z["rate"] for x, z in zip(tp_runs[key], tp_runs["mesh_tp"], strict=False)
                   if x is not None and z is not None and z["rate"]]
            for name, key in (("qos1/qos0", "qos1_tp"), ("curve/plain", "curve_tp"))
        }
        r["mesh_rtt"] = self.guarded("mesh_rtt", self.mesh_rtt, a, b)
        if secure:
            r["curve_rtt"] = self.guarded("curve_rtt", self.mesh_rtt, secure[0], secure[1], False,
                                          "(h) CURVE rtt")
            r["curve_auth"] = {d.name: self._node_info(d).get("auth", {}) for d in secure[:2]}
            for d in secure[:2]:
                d.stop()
        r["wire_rtt"] = self.guarded("wire_rtt", self.mesh_rtt, a, b, True)
        r["http"] = self.guarded("http", http_rows, a, b, self.logdir, 1000 if self.quick else 2000)
        if r["http"]:
            print_http_rows(r["http"])  # HTTP gateway vs Python client, same daemons (http_bench.py)
        self.repeat("publish", self.mesh_publish, a, b)
        self.repeat("wire_publish", self.wire_publish, a, b)
        self.repeat("wire_tp", lambda a, b, tag: self.wire_throughput(a, b, tag, False), a, b)
        self.repeat("wire_raw_tp", lambda a, b, tag: self.wire_throughput(a, b, tag, True), a, b)
        again = self.guarded("raw_tp", self.raw_throughput)  # raw again after meshd (noise check)
        raw_tp += [again] if again else []
        if raw_tp:
            r["raw_tp"] = self.best(raw_tp)

        # Counters after the load runs, before the kill tests (a peer seen stale here is spurious).
        r["daemon_stats_after_load"] = {d.name: self._daemon_stats(d) for d in (a, b)}

        print("discovery and liveness:", flush=True)
        kills = [self.guarded("stale", lambda: asyncio.run(self.stale_after_kill(a, b)))]
        for k in range(1 if self.quick else 2):
            c = self.daemon(f"C{k}")
            disc.append(self.guarded("discovery", lambda c=c: asyncio.run(self.discovery(a, c))))
            kills.append(self.guarded("stale", lambda c=c: asyncio.run(self.stale_after_kill(a, c))))
        r["discovery"] = [d for d in disc if d]
        r["stale"] = [k for k in kills if k]
        r["daemon_a_stats"] = self._daemon_stats(a)
        r["meta"]["loadavg_at_end"] = os.getloadavg()
        return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs, one repetition (~40 s)")
    ap.add_argument("--json", type=Path, help="write every measurement to this JSON file")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        run_role(args.role, json.loads(args.cfg or "{}"))
        return 0
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below still cleans up
    bench = Bench(args.quick)
    status = 0
    try:
        results = bench.run()
    except Exception as exc:
        print(f"bench aborted: {type(exc).__name__}: {exc}", flush=True)
        results, status = bench.results, 1
    finally:
        bench.cleanup()
    if "meta" not in results:
        return 1
    rows = build_table(results)
    results["table"] = rows
    results["total_s"] = time.monotonic() - t0
    print_table(rows)
    print(f"total {results['total_s']:.0f} s; {results['meta']['date']}; {results['meta']['machine']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.json}")
    if results.get("errors"):
        print(f"scenarios that failed: {', '.join(results['errors'])}")
    return status


if __name__ == "__main__":
    sys.exit(main())
