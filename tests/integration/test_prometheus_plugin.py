"""The meshd-prometheus plugin in a real daemon: pip-installed, found through its entry point, it
serves /metrics in the Prometheus text format, counts outcomes, latency and dead letters, reads
peers/agents/outbox from the node, and closes its port when the daemon stops."""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from meshd import Agent, NoSuchAgent
from meshd.plugins import AUTOLOAD_ENV  # on again: these tests are about entry-point plugins
from meshd.testing import MeshdFactory, MeshdProcess, pip_install, wait_listed, wait_until

REPO = Path(__file__).resolve().parents[2]
REQUESTS = 40  # well above the hook calls that are not per message (agents, peers, dead letters)

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
SAMPLE_RE = re.compile(rf"^({_NAME})(?:\{{({_LABEL}(?:,{_LABEL})*)?\}})? (\S+)$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("prom-site")
    pip_install(REPO / "plugins" / "meshd-prometheus", target)
    return target


def get(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    """(status, content type, body) of one GET on 127.0.0.1:port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode(errors="replace")


def parse(text: str) -> Samples:
    """Parse the text exposition format strictly: every line is a comment or `name{labels} value`,
    and every sample belongs to a family declared by a TYPE line before it."""
    assert text.endswith("\n")
    typed: dict[str, str] = {}
    samples: Samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            typed[name] = kind
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in typed else name
        assert family in typed, f"sample {name} has no TYPE line before it"
        pairs = frozenset(LABEL_RE.findall(labels or ""))
        key = (name, pairs)
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    return samples


def value(samples: Samples, metric: str, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


def scrape(port: int) -> Samples:
    status, ctype, body = get(port)
    assert status == 200, body
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype, ctype
    return parse(body)


def read_port(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().strip(), what="the metrics port file"))


def test_prometheus_plugin_serves_metrics(meshd_factory: MeshdFactory, installed_plugin: Path) -> None:
    port_file = meshd_factory.workdir / "prometheus.port"
    env = {"PYTHONPATH": str(installed_plugin), AUTOLOAD_ENV: "0", "MESHD_PROMETHEUS_PORT": "0",
           "MESHD_PROMETHEUS_PORT_FILE": str(port_file)}
    a = meshd_factory.spawn("a", env=env)
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    port = read_port(port_file)
    assert "prometheus" in a.info()["plugins"]["loaded"], a.info()["plugins"]

    async def scenario() -> Samples:
        async with Agent("asker", socket=a.socket) as asker, Agent("helper", socket=b.socket) as helper:
            helper.on("q")(lambda m: {"a": m.payload})
            helper.on("note")(lambda m: None)
            for _ in range(100):
                if "helper" in {x["name"] for x in await asker.agents()}:
                    break
                await asyncio.sleep(0.05)
            for i in range(REQUESTS):
                assert await asker.request("helper", "q", i, timeout=5) == {"a": i}
            with pytest.raises(NoSuchAgent):
                await asker.request("ghost", "q", {}, timeout=5)
            await asker.send("ghost", "note", {})  # fire-and-forget: a dead letter on a
            await asker.send("helper", "note", {}, qos=1)  # acknowledged: a "delivered" outcome

            # while asker is attached, its heartbeat telemetry shows up as a gauge
            def attached() -> Samples | None:
                s = scrape(port)
                online = value(s, "meshd_local_agents", state="online") or 0
                depth = value(s, "meshd_agent_queue_depth", agent="asker")
                return s if online >= 1 and depth is not None else None
            return await asyncio.to_thread(wait_until, attached, what="asker's telemetry in /metrics")
    during = asyncio.run(scenario())
    assert value(during, "meshd_agent_queue_depth", agent="asker") == 0

    def settled() -> Samples | None:  # the observer hooks run on the plugin worker: poll, bounded
        s = scrape(port)
        ok = value(s, "meshd_collaborations_total", kind="request", outcome="ok") or 0
        dead = value(s, "meshd_dead_letters_total", reason="NO_SUCH_AGENT") or 0
        delivered = value(s, "meshd_collaborations_total", kind="send", outcome="delivered") or 0
        return s if ok >= REQUESTS and dead >= 2 and delivered >= 1 else None
    s = wait_until(settled, what="outcomes and dead letters in /metrics")

    # outcomes and errors, as the node counts them; no event per message reached the plugin
    called = a.info()["plugins"]["stats"].get("called", 0)
    assert called < REQUESTS, f"{called} observer calls for {REQUESTS} requests"
    assert value(s, "meshd_collaborations_total", kind="request", outcome="ok") == REQUESTS
    assert value(s, "meshd_collaborations_total", kind="request", outcome="error") == 1
    assert value(s, "meshd_collaborations_total", kind="send", outcome="error") == 1
    assert value(s, "meshd_collaboration_errors_total", kind="send", code="NO_SUCH_AGENT") == 1
    assert value(s, "meshd_collaboration_errors_total", kind="request", code="NO_SUCH_AGENT") == 1
    assert (value(s, "meshd_node_dead_letters_total") or 0) >= 2

    # the latency histogram: cumulative buckets, +Inf == count, p50 <= p99
    count = value(s, "meshd_request_latency_seconds_count", kind="request")
    assert count is not None and count >= REQUESTS
    buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in s.items()
                     if name == "meshd_request_latency_seconds_bucket" and ("kind", "request") in labels)
    assert buckets[0][0] == 0.0005 and buckets[-2][0] == 30.0 and buckets[-1][0] == float("inf")
    assert all(x[1] <= y[1] for x, y in itertools.pairwise(buckets)), buckets
    assert buckets[-1][1] == count
    assert 0 < (value(s, "meshd_request_latency_seconds_sum", kind="request") or 0) < count * 5
    p50 = value(s, "meshd_request_latency_recent_seconds", kind="request", quantile="0.5")
    p99 = value(s, "meshd_request_latency_recent_seconds", kind="request", quantile="0.99")
    assert p50 is not None and p99 is not None and 0 < p50 <= p99
    assert (value(s, "meshd_request_latency_seconds_count", kind="send") or 0) >= 1  # the qos-1 ack

    # gauges read from the node
    assert value(s, "meshd_peers", state="online") == 1
    assert value(s, "meshd_peers", state="offline") == 0
    assert value(s, "meshd_qos1_pending") == 0
    assert value(s, "meshd_qos1_in_flight") == 0
    assert (value(s, "meshd_node_events_total", event="forwarded") or 0) >= REQUESTS
    assert (value(s, "meshd_node_events_total", event="delivered") or 0) >= REQUESTS  # the replies
    assert value(s, "meshd_node_events_total", event="malformed") == 0
    assert (value(s, "meshd_peer_state_changes_total", state="online") or 0) >= 1
    assert (value(s, "meshd_agent_state_changes_total", state="online") or 0) >= 2  # asker, helper
    assert value(s, "meshd_node_info", node=a.node_id, name="a", mesh=a.mesh) == 1
    assert (value(s, "meshd_plugin_events_total", event="called") or 0) >= 1

    # only /metrics is served
    status, _, _ = get(port, "/other")
    assert status == 404

    # a clean stop runs meshd_shutdown, which closes the port
    assert a.stop() == 0
    assert "prometheus metrics server stopped" in a.log_path.read_text()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_bad_port_does_not_stop_the_daemon(meshd_factory: MeshdFactory, installed_plugin: Path) -> None:
    a: MeshdProcess = meshd_factory.spawn("a", env={"PYTHONPATH": str(installed_plugin), AUTOLOAD_ENV: "0",
                                                    "MESHD_PROMETHEUS_PORT": "not-a-port"})
    # the start-up hooks run once the node is up, so poll (bounded)
    info = wait_until(lambda: (i := a.query("node"))["plugins"]["stats"].get("failed:prometheus") and i,
                      what="the plugin's start-up failure to be counted")
    assert a.alive()
    assert info["plugins"]["stats"]["failed:prometheus"] == 1, info["plugins"]
    assert "MESHD_PROMETHEUS_PORT='not-a-port'" in a.log_path.read_text()
    assert a.stop() == 0


def test_exporter_serves_only_metrics_and_frees_its_port(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """The HTTP side alone, in this process, against a fake NodeView (no daemon needed)."""
    import sys

    from meshd.view import MetricsSnapshot

    monkeypatch.syspath_prepend(str(REPO / "plugins" / "meshd-prometheus"))
    import meshd_prometheus as mp

    class View:
        node_id, name, mesh = "n1", "a", "m"

        def metrics_snapshot(self) -> MetricsSnapshot:
            return MetricsSnapshot(node_id="n1", name="a", mesh="m", uptime_s=1.0,
                                   peers_by_state={"online": 1})

        def info(self) -> dict[str, object]:
            return {}

        def agents(self) -> list[dict[str, object]]:
            return []

        def peers(self) -> list[dict[str, object]]:
            return []

        def dead_letters(self, limit: int = 100) -> list[dict[str, object]]:
            return []

    port_file = tmp_path / "port"
    monkeypatch.setenv(mp.ADDR_ENV, "127.0.0.1")
    monkeypatch.setenv(mp.PORT_ENV, "0")
    monkeypatch.setenv(mp.PORT_FILE_ENV, str(port_file))
    exporter = mp.Exporter(mp.Metrics())
    exporter.start(View())
    try:
        port = read_port(port_file)
        s = scrape(port)
        assert value(s, "meshd_peers", state="online") == 1
        assert value(s, "meshd_node_info", node="n1", name="a", mesh="m") == 1
        assert get(port, "/other")[0] == 404
    finally:
        exporter.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    sys.modules.pop("meshd_prometheus", None)


def test_protocol_metrics_move_under_a_scripted_load(meshd_factory: MeshdFactory,
                                                     installed_plugin: Path) -> None:
    """Messages by kind and topic, consumer lag of a slow agent (it grows, then drains), and the
    qos-1 outbox depth per destination (it rises while the receiving daemon is stopped, and falls
    once it runs again)."""
    import os
    import signal

    port_file = meshd_factory.workdir / "prometheus.port"
    env = {"PYTHONPATH": str(installed_plugin), AUTOLOAD_ENV: "0", "MESHD_PROMETHEUS_PORT": "0",
           "MESHD_PROMETHEUS_PORT_FILE": str(port_file)}
    a = meshd_factory.spawn("a", env=env)
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    port = read_port(port_file)

    def total(s: Samples, metric: str, **labels: str) -> float:
        return sum(v for (name, pairs), v in s.items()
                   if name == metric and set(labels.items()) <= set(pairs))

    async def scenario() -> None:
        gate = asyncio.Event()
        async with Agent("asker", socket=a.socket) as asker, \
                Agent("slow", socket=a.socket, max_concurrent_handlers=1, heartbeat_interval=0.2) as slow, \
                Agent("rx", socket=b.socket) as rx:
            @slow.on("work")
            async def work(msg: object) -> None:
                await gate.wait()

            rx.on("job")(lambda m: None)
            await wait_listed(asker, "rx")
            for i in range(5):
                await asker.send("slow", "work", i)
            for _ in range(3):
                await asker.publish("findings", {"n": 1}, reach=True)

            def lagging(least: float) -> Callable[[], Samples | None]:
                def check() -> Samples | None:
                    s = scrape(port)
                    waiting = value(s, "meshd_agent_waiting_messages", agent="slow") or 0
                    lag = value(s, "meshd_agent_lag_seconds", agent="slow") or 0
                    return s if waiting == 4 and lag > least else None
                return check
            first = await asyncio.to_thread(wait_until, lagging(0.0), what="slow's lag in /metrics")
            lag1 = value(first, "meshd_agent_lag_seconds", agent="slow") or 0
            later = await asyncio.to_thread(wait_until, lagging(lag1), what="slow's lag to grow")
            assert (value(later, "meshd_agent_lag_seconds", agent="slow") or 0) > lag1
            assert total(later, "meshd_messages_total", kind="send") >= 5
            assert value(later, "meshd_messages_total", kind="publish", topic="findings") == 3
            gate.set()

            def drained() -> bool:
                s = scrape(port)
                return value(s, "meshd_agent_waiting_messages", agent="slow") == 0 and \
                    value(s, "meshd_agent_lag_seconds", agent="slow") == 0
            await asyncio.to_thread(wait_until, drained, what="slow's lag to drain")

            os.kill(b.pid, signal.SIGSTOP)  # the receiver's daemon takes nothing: acks stop
            try:
                for i in range(3):
                    await asker.send("rx", "job", i, qos=1)  # returns once on a's disk
                def stored() -> Samples | None:  # the node's snapshot is rebuilt every second
                    s = scrape(port)
                    return s if value(s, "meshd_qos1_outbox_depth", dest="rx") == 3 else None
                s = await asyncio.to_thread(wait_until, stored, what="3 units for rx in a's outbox")
                assert (value(s, "meshd_qos1_pending") or 0) >= 3
            finally:
                os.kill(b.pid, signal.SIGCONT)

            def acked() -> bool:
                s = scrape(port)
                return value(s, "meshd_qos1_outbox_depth", dest="rx") is None and \
                    value(s, "meshd_qos1_pending") == 0
            await asyncio.to_thread(wait_until, acked, 30, what="the outbox for rx to empty")

    asyncio.run(scenario())
