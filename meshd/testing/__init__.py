"""Pytest fixtures for meshd and its plugins: real daemons on 127.0.0.1, cleaned up afterwards.

Registered as a ``pytest11`` plugin, so a plugin author's tests get them too::

    def test_roundtrip(meshd_factory):
        a = meshd_factory.spawn("a")
        b = meshd_factory.spawn("b")
        meshd_factory.wait_mesh([a, b])
        ...

Every daemon binds and discovers on 127.0.0.1 only, in a mesh named uniquely per test, so
parallel test runs never see each other.

The top layer beside :mod:`meshd.cli`: it may import anything; nothing in meshd imports it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.client import Agent
from meshd.errors import MeshError
from meshd.gateway.auth import GatewayAddress, find_gateway
from meshd.mesh.keys import load_or_create_node_keys, trust_key, untrust_key
from meshd.util.daemon_process import DaemonExited, DaemonProcess


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; raise TimeoutError naming ``what``."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def async_wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
                           what: str = "condition") -> Any:
    """``wait_until`` inside a test's event loop; ``predicate`` may be sync or async."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_listed(agent: Agent, *names: str, present: bool = True, timeout: float = 10.0) -> None:
    """Wait until ``agent``'s daemon lists every one of ``names`` (or none, with present=False)."""
    async def check() -> bool:
        listed = {a["name"] for a in await agent.agents()}
        return set(names) <= listed if present else not set(names) & listed
    await async_wait_until(check, timeout, 0.05, what=f"{names} {'listed' if present else 'gone'}")


LIBFAKETIME_GLOBS = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                     "/usr/local/lib/faketime/libfaketime.so.1")


def libfaketime() -> str | None:
    """The path of libfaketime (Debian package ``faketime``), or None where it is not installed."""
    for pattern in LIBFAKETIME_GLOBS:
        for path in sorted(glob.glob(pattern)):
            if os.path.exists(path):
                return path
    return None


def faketime_env(offset: str | None = None, *, offset_file: Path | None = None) -> dict[str, str]:
    """Environment that runs a process (``spawn(..., env=...)``, a subprocess) with its wall clock
    off by ``offset`` (libfaketime syntax: ``"-1h"``, ``"+3600"``), or by whatever ``offset_file``
    holds, re-read on every clock call so a test can jump the clock of a running process.

    Only the wall clock is faked (``FAKETIME_DONT_FAKE_MONOTONIC=1``): a host without NTP has a
    wrong wall clock, not a wrong monotonic one. Raises RuntimeError where libfaketime is missing
    (check ``libfaketime()`` first and skip).
    """
    lib = libfaketime()
    if lib is None:
        raise RuntimeError("libfaketime is not installed (Debian package 'faketime')")
    env = {"LD_PRELOAD": lib, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    if offset_file is not None:
        env |= {"FAKETIME_TIMESTAMP_FILE": str(offset_file), "FAKETIME_NO_CACHE": "1"}
    elif offset is not None:
        env["FAKETIME"] = offset
    else:
        raise ValueError("give an offset or an offset_file")
    return env
async def connect_until(make: Callable[[], Agent], deadline: float, retry_every: float = 0.2) -> Agent:
    """Connect a fresh agent from ``make()`` until one registers, retrying while its daemon is not
    there yet; past ``deadline`` (``time.monotonic()``) raise SystemExit naming the last error (for
    agent processes that tests start beside a daemon)."""
    last: BaseException | None = None
    while True:
        agent = make()
        try:
            await agent.connect()
            return agent
        except (MeshError, OSError) as exc:
            last = exc
            with contextlib.suppress(Exception):
                await agent.close()
        if time.monotonic() + retry_every > deadline:
            raise SystemExit(f"{agent.name}: could not connect to {agent.socket_path}: {last!r}")
        await asyncio.sleep(retry_every)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pip_install(source: Path, target: Path) -> None:
    """Install a plugin distribution into ``target`` offline, as a third party would ship it;
    put ``target`` on a daemon's PYTHONPATH and its entry points are found.

    pip builds a local project in its own tree (``build/``, ``*.egg-info``): test workers
    installing the same plugin at once raced there, and one got an install without the module.
    So each install builds from a private copy of the source."""
    with tempfile.TemporaryDirectory(prefix="meshd-pip-") as scratch:
        copy = Path(scratch) / source.name
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        r = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
             "--disable-pip-version-check", "--no-cache-dir", "--target", str(target), str(copy)],
            capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        raise RuntimeError(f"pip install of {source} failed:\n{r.stdout}\n{r.stderr}")


class MeshdProcess(DaemonProcess):
    """One real ``meshd run`` subprocess (``meshd.util.daemon_process.DaemonProcess``) with test conveniences:
    keys, one-shot queries, and the behaviour the fixtures always had (``start`` waits, returns
    self; ``secure`` instead of ``insecure``)."""

    def __init__(self, name: str, mesh: str, workdir: Path, args: list[str], secure: bool = False,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(name, mesh, workdir / name, args=args, insecure=not secure, env=env)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.secure = secure
        self._info: dict[str, Any] | None = None

    @property
    def public_key(self) -> str:
        """This node's CURVE public key (the keypair is created now if the daemon has not yet)."""
        return load_or_create_node_keys(self.state_dir).public

    def trust(self, *others: MeshdProcess) -> None:
        """Put the other nodes' public keys in this node's authorized-keys folder."""
        for other in others:
            trust_key(self.state_dir / "authorized_keys", other.name, other.public_key)

    def untrust(self, other: MeshdProcess) -> None:
        untrust_key(self.state_dir / "authorized_keys", other.name)

    def start(self, wait: bool = True) -> MeshdProcess:  # type: ignore[override]
        self._info = None
        super().start()
        if wait:
            self.wait_ready()
        return self

    def query(self, what: str) -> Any:
        """One-shot query (agents, peers, node) through a short-lived agent connection."""
        async def ask() -> Any:
            async with Agent(f"probe-{uuid.uuid4().hex[:8]}", socket=self.socket) as me:
                if what == "agents":
                    return [a for a in await me.agents() if not str(a["name"]).startswith("probe-")]
                if what == "peers":
                    return await me.peers()
                return await me.node_info()
        return self._run(ask)

    @staticmethod
    def _run(ask: Callable[[], Any]) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(ask())
        # Called from inside a test's event loop: run the query on a thread of its own.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, ask()).result(30)

    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self.query("node")
        return self._info

    @property
    def node_id(self) -> str:
        return str(self.info()["node"])

    @property
    def router(self) -> str:
        return str(self.info()["routers"][0])

    def dead_letters(self) -> list[dict[str, Any]]:
        """The daemon's dead letters (``meshctl deadletters list``)."""
        async def ask() -> Any:
            async with Agent(f"probe-{uuid.uuid4().hex[:8]}", socket=self.socket) as me:
                return await me.admin("deadletters.list")
        return list(self._run(ask))

    def gateway(self, timeout: float = 10.0) -> GatewayAddress:
        """The daemon's HTTP gateway (URL and token), once it has written ``http.json``."""
        def found() -> GatewayAddress | None:
            try:
                return find_gateway(self.socket)
            except Exception:
                return None
        address: GatewayAddress = wait_until(found, timeout, what=f"{self.name}'s http.json")
        return address

    def peer_states(self) -> dict[str, str]:
        return {p["node"]: p["state"] for p in self.query("peers")}

    def log(self) -> str:
        return self.log_tail(8000)

    def start_refused(self, label: str, timeout: float = 30.0) -> str:
        """Start on a fresh log and expect a refusal: exit 2 (a config or state error, which
        systemd does not restart) without a traceback. Returns that log for the test to check
        the message."""
        self.log_path.write_text("")
        self.start(wait=False)
        rc = self.wait_exit(timeout)
        log = self.log_tail()
        print(f"{label}: exit {rc}: {log.strip().splitlines()[-1] if log.strip() else ''}")
        assert rc == 2, log
        assert "Traceback" not in log, log
        return log


class MeshdFactory:
    """Spawns daemons for one test and cleans every one of them up."""

    def __init__(self, workdir: Path, mesh: str | None = None) -> None:
        self.workdir = workdir
        self.mesh = mesh or f"t{uuid.uuid4().hex[:12]}"
        self.procs: list[MeshdProcess] = []

    def spawn(self, name: str, *extra: str, mesh: str | None = None, fast: bool = True,
              wait: bool = True, secure: bool = False, start: bool = True,
              env: dict[str, str] | None = None) -> MeshdProcess:
        args = ["--interface", "127.0.0.1", *extra]
        if fast and "--offline-after" not in extra:
            args += ["--heartbeat-interval", "0.25", "--stale-after", "1", "--offline-after", "2"]
        proc = MeshdProcess(name, mesh or self.mesh, self.workdir, args, secure=secure, env=env)
        self.procs.append(proc)
        return proc.start(wait=wait) if start else proc

    def wait_mesh(self, procs: list[MeshdProcess], timeout: float = 15.0) -> None:
        """Wait until every daemon sees every other one online."""
        ids = {p.node_id for p in procs}
        for p in procs:
            others = ids - {p.node_id}

            def sees_all(p: MeshdProcess = p, others: set[str] = others) -> bool:
                return others <= {n for n, s in p.peer_states().items() if s == "online"}

            wait_until(sees_all, timeout, interval=0.05, what=f"{p.name} to see {len(others)} peers online")

    def cleanup(self) -> None:
        for p in self.procs:
            p.kill()


def short_tempdir(prefix: str = "mshd-") -> Path:
    """A short temp dir: ipc socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture
def meshd_factory(request: pytest.FixtureRequest) -> Iterator[MeshdFactory]:
    """Start real meshd daemons on 127.0.0.1; all are killed and removed after the test."""
    workdir = short_tempdir()
    factory = MeshdFactory(workdir)
    yield factory
    factory.cleanup()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for p in factory.procs:
            sys.stderr.write(f"\n--- log of meshd {p.name} ---\n{p.log()}\n")
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep


def raw_agent(socket: str | Path) -> tuple[Any, Any]:
    """A raw DEALER on a daemon's agent socket, in a context of its own: ``(ctx, sock)``. For
    tests that send what the client library never would (hostile headers, forged answers)."""
    import zmq

    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{socket}")
    return ctx, sock


def recv_skipping_pings(sock: Any) -> dict[str, Any]:
    """The header of the next envelope on a raw agent connection that is not a daemon's ping.
    Blocking: call it in a thread (``asyncio.to_thread``), so the agents' loop keeps running."""
    import msgpack

    while True:
        assert sock.poll(5000), "the daemon did not answer"
        _, hdr, _ = sock.recv_multipart()
        header: dict[str, Any] = msgpack.unpackb(hdr)
        if header["kind"] != "ping":
            return header


async def register_raw(sock: Any, name: str) -> None:
    """Register ``name`` on a raw agent connection and wait for the daemon's ``ok``."""
    import msgpack

    from meshd.wire import protocol as P

    sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}),
                         msgpack.packb({"name": name})])
    assert (await asyncio.to_thread(recv_skipping_pings, sock))["kind"] == "ok"


def stuck_subscriber(ctx: Any, proc: MeshdProcess, name: str, topic: str) -> Any:
    """A raw agent connection (a pyzmq DEALER in ``ctx``) that registers ``name``, subscribes to
    ``topic`` and then reads nothing: small receive buffers, so the daemon's inbox for it fills at
    once. It does not heartbeat; the caller sends ``agent_hb`` if it must stay registered."""
    import msgpack
    import zmq

    from meshd.wire import protocol as P

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 10)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(f"ipc://{proc.socket}")
    for header, body in (({"kind": "register", "id": "r1"}, msgpack.packb({"name": name})),
                         ({"kind": "subscribe", "id": "s1", "topic": topic}, b"")):
        sock.send_multipart([P.SIGNATURE, msgpack.packb(header), body])
        kind = "ping"
        while kind == "ping":  # the daemon may probe its connections meanwhile
            assert sock.poll(5000), f"{name}: the daemon did not answer {header['kind']}"
            kind = msgpack.unpackb(sock.recv_multipart()[1])["kind"]
        assert kind == "ok", f"{name}: {header['kind']} answered {kind}"
    return sock


__all__ = ["DaemonExited", "MeshdFactory", "MeshdProcess", "async_wait_until", "connect_until",
           "faketime_env", "libfaketime", "meshd_factory", "pid_alive", "pip_install", "raw_agent",
           "recv_skipping_pings", "register_raw", "short_tempdir", "stuck_subscriber", "wait_listed",
           "wait_until"]
