"""qos 1 across two netlab hosts: a partition and random packet loss lose nothing confirmed.

Host 1 runs daemon ``a`` with the sending agent's daemon, host 2 daemon ``b`` with the receiving
agent's; the two agents are processes in the root namespace (an ipc:// socket is a file), the
same ones the loopback fault tests use (tests/integration/qos_agents.py). Each scenario streams
2,000 qos-1 messages and prints one summary line (``-s``)::

    sent=N handled=U lost=L dup_delivered=D dup_suppressed=S p50=.. p99=..

(see tests/integration/test_qos1_faults.py for the fields). Daemons: MESHD_QOS1_ACK_TIMEOUT=1,
MESHD_QOS1_ATTEMPTS=10 (instead of 5 s and 3, so retries come within seconds), ttl a day; fast
liveness (beat 0.25 s, stale 1 s, offline 2 s); plaintext on the private bridge
(``allow_insecure_lan = true`` and ``--insecure``), as in conftest.py.

Needs root, iproute2 and netlab (and nftables for the loss scenario); skipped with a reason
otherwise. The lab (prefix of random letters) is removed at teardown whatever happens.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from meshd.testing import short_tempdir
from meshd.testing.netlab import random_prefix

from .conftest import FAST, Netlab, NetnsDaemon, skip_reason

pytestmark = pytest.mark.multihost

PARTITION_S = 5.0
LOSS_PCT = 20
SENDER_HOST, RECEIVER_HOST = 1, 2


def _harness() -> ModuleType:
    """tests/integration/qos_agents.py: the agent processes and the Stream harness."""
    if "qos_agents" in sys.modules:
        return sys.modules["qos_agents"]
    path = Path(__file__).resolve().parents[1] / "integration" / "qos_agents.py"
    spec = importlib.util.spec_from_file_location("qos_agents", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["qos_agents"] = module
    spec.loader.exec_module(module)
    return module


H = _harness()


class Lab:
    def __init__(self) -> None:
        # No digits: netlab finds the switch by stripping a host name's trailing digits.
        self.net = Netlab(random_prefix("mq"))
        self.prefix = self.net.prefix
        self.workdir = short_tempdir("mshq-")
        self.mesh = f"mq{uuid.uuid4().hex[:12]}"
        self.daemons: dict[int, NetnsDaemon] = {}

    def host(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def start(self) -> None:
        self.net.up(2)
        config = self.workdir / "meshd.toml"
        config.write_text("allow_insecure_lan = true\n")
        for i, name in ((SENDER_HOST, "a"), (RECEIVER_HOST, "b")):
            self.daemons[i] = NetnsDaemon(self.host(i), name, self.mesh, self.workdir,
                                          ["--config", str(config), "--interface", f"198.18.0.{i}", *FAST],
                                          env=H.QOS_ENV)
        for d in self.daemons.values():
            d.start(wait=False)
        for d in self.daemons.values():
            d.wait_ready()

    @property
    def a(self) -> NetnsDaemon:
        return self.daemons[SENDER_HOST]

    @property
    def b(self) -> NetnsDaemon:
        return self.daemons[RECEIVER_HOST]

    def close(self, dump: bool) -> None:
        try:
            for d in self.daemons.values():
                d.terminate()
            if dump:
                for d in self.daemons.values():
                    sys.stderr.write(f"\n--- log of meshd {d.name} ({d.netns}) ---\n{d.log()}\n")
        finally:
            try:
                self.net.down()
            finally:
                shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    lab = Lab()
    failed_before = request.session.testsfailed
    ok = False
    try:
        lab.start()
        ok = True
        yield lab
    finally:
        lab.close(dump=not ok or request.session.testsfailed > failed_before)


@pytest.fixture
def stream(lab: Lab, request: pytest.FixtureRequest) -> Iterator[Any]:
    # Fresh agent names per test: nothing of an earlier stream can be mistaken for this one's.
    s = H.Stream(lab.a, lab.b, lab.workdir, tag=f"-{request.node.name.split('_')[-1]}")
    yield s
    s.cleanup()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for role in ("sender", "receiver"):
            sys.stderr.write(f"\n--- log of the {role} agent ---\n{s.agent_log(role)}\n")


def test_partition(lab: Lab, stream: Any) -> None:
    """4. The receiver's host is cut off for 5 s mid-stream (from ~500 handled), then plugged."""
    stream.start_receiver()
    stream.start_sender()
    stream.wait_handled(500, timeout=30)
    lab.net.cut(RECEIVER_HOST)
    cut_at = H.count_lines(stream.recv_out)
    try:
        time.sleep(PARTITION_S)
        during = H.count_lines(stream.recv_out) - cut_at
    finally:
        lab.net.plug(RECEIVER_HOST)
    t_plug = time.monotonic()
    stats = stream.finish(f"netlab {PARTITION_S:g} s partition", timeout=80)
    print(f"  (cut after {cut_at} handler runs; {during} more ran during the cut; all handled and "
          f"acked {time.monotonic() - t_plug:.1f} s after the plug)")
    H.check(stats, H.COUNT // 100)
    assert stats["dup_delivered"] == 0, "a partition alone must not make a handler run twice"


def test_packet_loss(lab: Lab, stream: Any) -> None:
    """5. 20 % of the packets the receiver's host gets are dropped for the whole stream."""
    if shutil.which("nft") is None:
        pytest.skip("netlab loss needs nftables (`nft` not found)")
    stream.start_receiver()
    lab.net.loss(RECEIVER_HOST, LOSS_PCT)
    t0 = time.monotonic()
    try:
        stream.start_sender()
        stats = stream.finish(f"netlab {LOSS_PCT}% packet loss at the receiver", timeout=80)
    finally:
        lab.net.loss(RECEIVER_HOST, 0)
    print(f"  (stream handled and acked in {time.monotonic() - t0:.1f} s)")
    H.check(stats, H.COUNT // 100)
    assert stats["dup_delivered"] == 0, "lost packets alone must not make a handler run twice"
