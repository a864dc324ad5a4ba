"""sd_notify end to end: a real ``meshd run`` talks to a NOTIFY_SOCKET this test binds, as systemd would.

The unit (systemd/meshd.service) is ``Type=notify``, ``NotifyAccess=main``, ``WatchdogSec=10``. Here the
test plays systemd's part: it binds an AF_UNIX datagram socket (a file path, or an abstract ``@name``),
starts the daemon with ``NOTIFY_SOCKET`` and ``WATCHDOG_USEC`` set, and checks what arrives:
READY=1 (with MAINPID and a STATUS naming peers and agents) first, STATUS when an agent attaches and
leaves, WATCHDOG=1 at half the watchdog period, and after SIGTERM STOPPING=1 last, then exit 0.
Every datagram must come from the daemon's main PID (SCM_CREDENTIALS), or NotifyAccess=main would
drop it. No fixed sleeps: every wait is a receive with a timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from meshd import Agent
from meshd.testing import MeshdProcess, short_tempdir

WATCHDOG_USEC = 1_000_000  # WatchdogSec=1: the daemon must ping every 0.5 s
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_LOCAL_AGENTS = re.compile(r"(\d+) local agents?")


@dataclass
class Notification:
    seq: int
    at: float
    pid: int | None
    fields: dict[str, str]
    raw: str

    def has(self, key: str, value: str | None = None) -> bool:
        return key in self.fields and (value is None or self.fields[key] == value)


@dataclass
class NotifyListener:
    """The systemd side of sd_notify: one bound AF_UNIX SOCK_DGRAM socket, credentials on."""

    address: str  # what goes into NOTIFY_SOCKET
    sock: socket.socket
    received: list[Notification] = field(default_factory=list)

    @classmethod
    def bind(cls, workdir: Path, abstract: bool) -> NotifyListener:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        if abstract:
            name = f"meshd-test-notify-{uuid.uuid4().hex}"
            sock.bind("\0" + name)
            return cls(f"@{name}", sock)
        path = workdir / "notify.sock"
        sock.bind(str(path))
        return cls(str(path), sock)

    def recv(self, timeout: float) -> Notification | None:
        """The next datagram, or None when nothing arrives within ``timeout`` seconds."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
        except TimeoutError:
            return None
        pid = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = _UCRED.unpack(payload[: _UCRED.size])[0]
        text = data.decode()
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        note = Notification(len(self.received), time.monotonic(), pid, fields, text)
        self.received.append(note)
        return note

    def wait_for(self, what: str, predicate: Callable[[Notification], bool],
                 timeout: float = 15.0) -> Notification:
        """Receive until a datagram matches ``predicate``; fail naming ``what`` on timeout."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            note = self.recv(left) if left > 0 else None
            if note is None:
                seen = "\n".join(repr(n.raw) for n in self.received[-10:])
                pytest.fail(f"no {what} within {timeout:g} s; last datagrams:\n{seen}")
            if predicate(note):
                return note

    def drain(self) -> None:
        while self.recv(0.2) is not None:
            pass

    def close(self) -> None:
        self.sock.close()


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    meshd: MeshdProcess

    def log(self) -> str:
        return self.meshd.log()


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tempdir("mshdn-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_daemon(workdir: Path, notify_address: str) -> Daemon:
    """``meshd run`` on 127.0.0.1 (insecure, loopback only) with systemd's notify environment."""
    meshd = MeshdProcess("n", f"t{uuid.uuid4().hex[:12]}", workdir, ["--interface", "127.0.0.1"])
    # WATCHDOG_PID unset (so the pings are meant for this process); no MESHD_* or systemd dirs leaking in.
    skip = ("WATCHDOG_PID", "RUNTIME_DIRECTORY", "STATE_DIRECTORY")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHD_") and k not in skip}
    env["NOTIFY_SOCKET"] = notify_address
    env["WATCHDOG_USEC"] = str(WATCHDOG_USEC)
    with open(meshd.log_path, "ab") as log:
        proc = subprocess.Popen(meshd.command(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    return Daemon(proc, meshd)


def local_agents(note: Notification) -> int | None:
    match = _LOCAL_AGENTS.search(note.fields.get("STATUS", ""))
    return int(match.group(1)) if match else None


async def attach_agent(daemon: Daemon, listener: NotifyListener) -> None:
    """Attach one agent: STATUS must count it; detach: STATUS must count it gone."""
    async with Agent(f"sdn-{uuid.uuid4().hex[:8]}", socket=daemon.meshd.socket):
        await asyncio.to_thread(listener.wait_for, "STATUS with 1 local agent",
                                lambda n: n.has("STATUS") and local_agents(n) == 1)
    await asyncio.to_thread(listener.wait_for, "STATUS with 0 local agents after the agent left",
                            lambda n: n.has("STATUS") and local_agents(n) == 0)


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_status_watchdog_stopping(workdir: Path, abstract: bool) -> None:
    listener = NotifyListener.bind(workdir, abstract)
    daemon = start_daemon(workdir, listener.address)
    try:
        # READY=1 first: sockets bound, discovery running.
        ready = listener.wait_for("READY=1", lambda n: n.has("READY", "1"), timeout=30)
        assert ready.seq == 0, f"READY=1 must be the first datagram, got {listener.received[0].raw!r}"
        assert ready.has("MAINPID", str(daemon.proc.pid)), ready.raw
        status = ready.fields.get("STATUS", "")
        assert "peers" in status and "agents" in status, f"READY's STATUS names no peers/agents: {status!r}"
        assert local_agents(ready) == 0, status
        assert daemon.meshd.socket.exists(), "READY=1 before the agent socket was bound"

        # STATUS follows the directory: an agent attaches, then leaves.
        asyncio.run(attach_agent(daemon, listener))

        # WATCHDOG=1 keeps coming at about half of WATCHDOG_USEC.
        pings = [listener.wait_for(f"WATCHDOG=1 #{i + 1}", lambda n: n.has("WATCHDOG", "1"), timeout=5)
                 for i in range(4)]
        gaps = [b.at - a.at for a, b in itertools.pairwise(pings)]
        assert min(gaps) > 0.1, f"watchdog pings far too often: {gaps}"
        assert statistics.median(gaps) < WATCHDOG_USEC / 1e6, f"pings slower than the watchdog: {gaps}"

        # SIGTERM: STOPPING=1, then a clean exit 0.
        daemon.proc.send_signal(signal.SIGTERM)
        stopping = listener.wait_for("STOPPING=1", lambda n: n.has("STOPPING", "1"), timeout=15)
        assert daemon.proc.wait(15) == 0, daemon.log()
        listener.drain()
        assert not daemon.meshd.socket.exists(), "agent socket left behind after a clean stop"

        notes = listener.received
        assert [n.seq for n in notes if n.has("READY")] == [ready.seq], "READY=1 sent more than once"
        after = [n.raw for n in notes[stopping.seq + 1:]]
        assert notes[-1] is stopping, f"datagrams after STOPPING=1: {after}"
        middle = notes[1:-1]
        assert middle and all(n.has("STATUS") or n.has("WATCHDOG") for n in middle), \
            [n.raw for n in middle]
        # NotifyAccess=main: systemd only accepts datagrams from the main PID.
        assert {n.pid for n in notes} == {daemon.proc.pid}, [(n.pid, n.raw) for n in notes]
    except BaseException:
        print(f"--- meshd log ---\n{daemon.log()}")
        raise
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(5)
        listener.close()
