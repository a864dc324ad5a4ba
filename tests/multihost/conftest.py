"""Multi-host fixtures: one real ``meshd run`` per netlab host (a network namespace each).

``meshd.testing.netlab`` (in the package: a fresh clone needs nothing beside it) builds hosts
PREFIX1..PREFIX3 with addresses 198.18.0.1-3 on one bridge; mDNS multicast works between them.
Each daemon runs inside its host's namespace and binds/discovers only on that host's eth0. The
agents run in this (root-namespace) pytest process: an ipc:// socket is a file, so it is reachable
from any network namespace.

Needs root and iproute2; every test here is skipped with a reason otherwise. The prefix is
random lowercase letters, so parallel sessions never share hosts, and ``Netlab.down`` always runs
at teardown.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.client import BlockingAgent, Message
from meshd.testing import MeshdProcess, short_tempdir, wait_until
from meshd.testing.netlab import Netlab, random_prefix, skip_reason

__all__ = ["AGENT_HEARTBEAT", "FAST", "HOSTS", "MultiHost", "Netlab", "NetnsDaemon", "running", "skip_reason"]

HOSTS = 3
FAST = ["--heartbeat-interval", "0.25", "--stale-after", "1", "--offline-after", "2"]
AGENT_HEARTBEAT = 0.25  # the daemon's --offline-after applies to its local agents too


class NetnsDaemon(MeshdProcess):
    """A ``meshd run`` started inside a network namespace (``ip netns exec`` execs, so the
    Popen pid is the daemon's own and SIGTERM reaches it)."""

    def __init__(self, netns: str, name: str, mesh: str, workdir: Path, args: list[str],
                 secure: bool = False, env: dict[str, str] | None = None) -> None:
        super().__init__(name, mesh, workdir, args, secure=secure, env=env)
        self.netns = netns

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *super().command()]

    def terminate(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"\nmeshd {self.name} ignored SIGTERM for {timeout:g} s: SIGKILL\n")
            self.proc.kill()
            self.proc.wait(5)


class MultiHost:
    """Three hosts, one daemon and one echo agent (``echo<i>``) per host."""

    def __init__(self, lab: Netlab, workdir: Path, mesh: str, secret: Path | None = None,
                 env: dict[int, dict[str, str]] | None = None) -> None:
        self.secret = secret  # mesh-secret mode (CURVE) instead of plaintext
        self.env = env or {}  # extra environment per host number (a fake clock, for one)
        self.lab = lab
        self.workdir = workdir
        self.mesh = mesh
        self.daemons: dict[int, NetnsDaemon] = {}
        self.agents: dict[int, BlockingAgent] = {}
        self.node_ids: dict[int, str] = {}
        self.started_at = 0.0

    @staticmethod
    def address(i: int) -> str:
        return f"198.18.0.{i}"

    @staticmethod
    def agent_name(i: int) -> str:
        return f"echo{i}"

    def start(self) -> None:
        # --insecure is loopback-only unless the config allows it on a LAN (here: a private bridge).
        config = self.workdir / "meshd.toml"
        if self.secret is not None:
            config.write_text(f'trust_mode = "secret"\nmesh_secret_file = "{self.secret}"\n')
        else:
            config.write_text("allow_insecure_lan = true\n")
        for i in range(1, HOSTS + 1):
            d = NetnsDaemon(self.lab.host(i), f"h{i}", self.mesh, self.workdir,
                            ["--config", str(config), "--interface", self.address(i), *FAST],
                            secure=self.secret is not None, env=self.env.get(i))
            self.daemons[i] = d
        self.started_at = time.monotonic()
        for d in self.daemons.values():
            d.start(wait=False)
        for d in self.daemons.values():
            d.wait_ready()
        for i, d in self.daemons.items():
            agent = BlockingAgent(self.agent_name(i), socket=d.socket, heartbeat_interval=AGENT_HEARTBEAT)
            self.agents[i] = agent
            self.node_ids[i] = str(agent.agent.node)

            @agent.on("echo")
            def echo(msg: Message, i: int = i) -> Any:
                return {"host": i, "from": msg.sender, "payload": msg.payload}

    # ------------------------------------------------------------------ views, through the agents

    def peer_states(self, at: int) -> dict[str, str]:
        """node id -> state, as host ``at``'s daemon reports it."""
        return {str(p["node"]): str(p["state"]) for p in self.agents[at].peers()}

    def state_of(self, at: int, host: int) -> str | None:
        """The state host ``at`` gives ``host`` (None: not listed)."""
        return self.peer_states(at).get(self.node_ids[host])

    def agent_names(self, at: int) -> set[str]:
        return {str(a["name"]) for a in self.agents[at].agents()}

    def sees_online(self, at: int, host: int) -> bool:
        return self.state_of(at, host) == "online" and self.agent_name(host) in self.agent_names(at)

    def wait_full_mesh(self, timeout: float = 20.0, among: list[int] | None = None) -> None:
        hosts = list(self.agents) if among is None else among
        for at in hosts:
            for host in hosts:
                if host != at:
                    wait_until(lambda at=at, host=host: self.sees_online(at, host), timeout, interval=0.05,
                               what=f"h{at} to see h{host} online with its agent")

    def close(self) -> None:
        for agent in self.agents.values():
            try:
                agent.close()
            except Exception as exc:  # teardown goes on: the daemons and namespaces must go
                sys.stderr.write(f"\nclosing agent {agent.agent.name}: {exc!r}\n")
        for d in self.daemons.values():
            d.terminate()

    def dump_logs(self) -> None:
        for d in self.daemons.values():
            sys.stderr.write(f"\n--- log of meshd {d.name} ({d.netns}) ---\n{d.log()}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The netlab tests in one xdist group (``--dist loadgroup``), the sixteen-daemon test in
    another: each group runs one test after another on one worker, so few labs of several daemons
    load the machine at once, and a module's lab is built once, not once per worker."""
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.path).startswith(here):
            # The sixteen-daemon test (a minute and a half) is a group of its own, beside the rest.
            group = "netlab-scale" if item.path.name == "test_scale_netlab.py" else "netlab"
            item.add_marker(pytest.mark.xdist_group(group))


def _prefix() -> str:
    return random_prefix("mt")


@contextlib.contextmanager
def running(request: pytest.FixtureRequest, mh: MultiHost) -> Iterator[MultiHost]:
    """Bring up ``mh``'s hosts and daemons; always tear everything down (logs shown on failure)."""
    failed_before = request.session.testsfailed
    ok = False
    try:
        mh.lab.up(HOSTS)
        mh.start()
        ok = True
        yield mh
    finally:
        try:
            mh.close()
            if not ok or request.session.testsfailed > failed_before:
                mh.dump_logs()
        finally:
            try:
                mh.lab.down()
            finally:
                shutil.rmtree(mh.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def multihost(request: pytest.FixtureRequest) -> Iterator[MultiHost]:
    """Three netlab hosts, each with a meshd and an echo agent; torn down completely afterwards."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    mh = MultiHost(Netlab(_prefix()), short_tempdir("mshmh-"), mesh=f"mh{uuid.uuid4().hex[:12]}")
    with running(request, mh):
        yield mh
