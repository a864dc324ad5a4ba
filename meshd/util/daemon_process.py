"""Run a ``meshd run`` daemon as a subprocess: one helper for the test fixtures, the demo and the bench.

Owns: the daemon's command line, its files (``<dir>/state``, ``<dir>/s.sock``, ``<dir>/meshd.log``,
``<dir>/notify.sock``), starting it with its output in the log, waiting until it is ready, and
ending it by its PID (SIGTERM, the clean path; SIGKILL when that takes too long or when asked).

"Ready" is what systemd means by it: the daemon sends ``READY=1`` to ``NOTIFY_SOCKET`` once every
start step ran (gateway, plugins' ``meshd_startup``, the system agent), which is later than the
agent socket appearing. The helper plays systemd's part with a datagram socket of its own, unless
the caller passes its own ``NOTIFY_SOCKET``; then it falls back to waiting for the agent socket.

Must not touch: pytest (plugin authors' tests and ``meshd demo`` import this without it), the
daemon's protocol (asking a daemon something goes through ``meshd.client``), or any process it
did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket as pysocket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["DaemonExited", "DaemonProcess"]

READY_TIMEOUT = 15.0
READY_POLL = 0.02


class DaemonExited(RuntimeError):
    """The daemon exited while we waited for it; the message carries its exit code and log tail."""

    def __init__(self, name: str, returncode: int | None, log_tail: str) -> None:
        super().__init__(f"meshd {name} exited with {returncode}:\n{log_tail}")
        self.returncode = returncode


class DaemonProcess:
    """One ``meshd run`` subprocess living in ``dir`` (created on ``start``).

    ``insecure`` adds ``--insecure``; ``args`` are further flags (``--interface 127.0.0.1``...);
    ``env`` is merged over this process's environment; ``cwd`` is the child's working directory.
    """

    def __init__(self, name: str, mesh: str, dir: Path, *, args: Sequence[str] = (),
                 insecure: bool = True, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.mesh = mesh
        self.dir = dir
        self.state_dir = dir / "state"
        self.socket = dir / "s.sock"
        self.log_path = dir / "meshd.log"
        self.args = list(args)
        self.insecure = insecure
        self.env = dict(env) if env else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0
        self.notify_path = dir / "notify.sock"
        self._notify: pysocket.socket | None = None
        self._ready = False

    def command(self) -> list[str]:
        return [sys.executable, "-m", "meshd", "run", "--name", self.name, "--mesh", self.mesh,
                "--state-dir", str(self.state_dir), "--socket", str(self.socket),
                *(["--insecure"] if self.insecure else []), *self.args]

    def start(self) -> None:
        """Spawn the daemon (stdin /dev/null, stdout and stderr appended to ``log_path``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env} if self.env else dict(os.environ)
        self._close_notify()
        self._ready = False
        if not (self.env and "NOTIFY_SOCKET" in self.env):
            with contextlib.suppress(FileNotFoundError):
                self.notify_path.unlink()
            sock = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_DGRAM | pysocket.SOCK_CLOEXEC)
            sock.bind(str(self.notify_path))
            sock.setblocking(False)
            self._notify = sock
            env["NOTIFY_SOCKET"] = str(self.notify_path)
        self.spawned_at = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         cwd=str(self.cwd) if self.cwd else None)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"meshd {self.name} was not started")
        return self.proc.pid

    def exited(self) -> int | None:
        """The exit code, or None while it runs (or was never started)."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        """Whether it said READY=1 (or, with the caller's own NOTIFY_SOCKET, whether its agent socket
        is bound); raises DaemonExited if the daemon is gone."""
        if self.proc is not None and self.proc.poll() is not None:
            raise DaemonExited(self.name, self.proc.returncode, self.log_tail())
        if self._notify is None:
            return self.socket.exists()
        while not self._ready:
            try:
                datagram = self._notify.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            self._ready = b"READY=1" in datagram.split(b"\n")
        return self._ready

    def _close_notify(self) -> None:
        if self._notify is not None:
            self._notify.close()
            self._notify = None
            with contextlib.suppress(FileNotFoundError):
                self.notify_path.unlink()

    def wait_ready(self, timeout: float = READY_TIMEOUT, interval: float = READY_POLL) -> float:
        """Wait until the daemon is ready (READY=1, see the module docstring); return the seconds
        since ``start``. Raises DaemonExited or TimeoutError (naming the daemon)."""
        end = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > end:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for meshd {self.name} to start")
            time.sleep(interval)
        return time.monotonic() - self.spawned_at

    def sigterm(self) -> None:
        """Ask it to stop (drain, BYE, mDNS goodbye, exit 0) without waiting."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float) -> int:
        """Wait for its exit; raises subprocess.TimeoutExpired."""
        if self.proc is None:
            raise RuntimeError(f"meshd {self.name} was not started")
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait up to ``timeout``; past it SIGKILL and re-raise TimeoutExpired."""
        if self.proc is None or self.proc.poll() is not None:
            self._close_notify()
            return self.proc.returncode if self.proc else None
        self.sigterm()
        try:
            code = self.wait_exit(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close_notify()
        return code

    def kill(self) -> None:
        """SIGKILL: no goodbye, no BYE; peers must notice on their own."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(5)
        self._close_notify()

    def log_tail(self, chars: int = 8000) -> str:
        """The last ``chars`` characters of its log ("" if there is none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:] if chars else text
