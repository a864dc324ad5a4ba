"""Idle resident memory of meshd's daemon and agent, as bench/README.md "Memory (goal 6)" measures it.

``idle_memory.py [--runs 5] [--settle 2] [--tree DIR] [--env K=V ...] [--agent]``: starts ``runs``
daemons one after another (default config, HTTP gateway on, 127.0.0.1 only, a unique mesh name),
each read ``settle`` seconds after READY=1 (VmRSS, and anonymous / file-backed from
``/proc/PID/smaps_rollup``; whether OpenSSL's libcrypto is mapped) and stopped by its PID; with
``--agent`` also one idle agent (``idle.py meshd``, asyncio imported first as the README writes
it) per daemon. Prints each reading and the
medians. ``--tree`` runs another checkout's meshd (for A/B runs: alternate old and new back to
back); ``--env`` sets environment variables for the daemon. Bytecode is compiled first, as a
wheel install has it.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))

from meshd.util.daemon_process import DaemonProcess  # noqa: E402


def memory(pid: int) -> dict[str, float]:
    """VmRSS, anonymous and file-backed resident MiB of ``pid``."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) / 1024
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Anonymous", "Rss"):
                out[key.lower()] = int(rest.split()[0]) / 1024
    out["file"] = out.get("rss", 0.0) - out.get("anonymous", 0.0)
    with open(f"/proc/{pid}/maps") as f:
        out["libcrypto"] = float(any("libcrypto" in line for line in f))
    return out


def idle_agent(tree: Path, socket: Path, settle: float) -> dict[str, float]:
    cfg = json.dumps({"name": "idle-agent", "socket": str(socket)})
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, str(BENCH_DIR / "idle.py"), "meshd", cfg], cwd=str(tree),
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("idle agent exited")
        time.sleep(settle)
        return memory(proc.pid)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--tree", type=Path, default=REPO)
    ap.add_argument("--env", action="append", default=[], help="K=V for the daemon")
    ap.add_argument("--agent", action="store_true", help="also an idle agent per daemon")
    ap.add_argument("--secure", action="store_true", help="CurveZMQ on (no --insecure), keys mode")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tree: Path = args.tree.resolve()
    compileall.compile_dir(str(tree / "meshd"), quiet=1)
    env = {"PYTHONPATH": str(tree)}
    env.update(kv.split("=", 1) for kv in args.env)
    daemons: list[dict[str, float]] = []
    agents: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="meshd-idle-") as tmp:
        for i in range(args.runs):
            d = DaemonProcess(f"idle{i}", f"idle-{os.getpid()}-{i}", Path(tmp) / f"d{i}",
                              args=["--interface", "127.0.0.1"], env=env, cwd=tree, insecure=not args.secure)
            d.start()
            try:
                d.wait_ready(30)
                time.sleep(args.settle)
                daemons.append(memory(d.pid))
                if args.agent:
                    agents.append(idle_agent(tree, d.socket, args.settle))
            finally:
                try:
                    d.stop(10)
                except subprocess.TimeoutExpired:
                    pass
            line = f"daemon {i}: " + " ".join(f"{k} {v:.1f}" for k, v in daemons[-1].items())
            if agents:
                line += "; agent: " + " ".join(f"{k} {v:.1f}" for k, v in agents[-1].items())
            print(line, flush=True)
    result = {"daemon": {k: statistics.median(m[k] for m in daemons) for k in daemons[0]}}
    if agents:
        result["agent"] = {k: statistics.median(m[k] for m in agents) for k in agents[0]}
    if args.json:
        print(json.dumps(result))
    else:
        for who, med in result.items():
            print(f"median of {args.runs} {who}: " + " ".join(f"{k} {v:.2f}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
