"""plugins/meshd-prometheus's collector alone: a fake NodeView with a frozen MetricsSnapshot, the
node's collaboration tally and the observer hooks' counters, rendered by prometheus_client and
parsed back (no daemon, no socket)."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from meshd.delivery.outcomes import LATENCY_BUCKETS_S, LATENCY_WINDOW, MAX_TALLY_KEYS, Tally  # noqa: E402
from meshd.view import MetricsSnapshot, NodeView  # noqa: E402

# Loaded from its file, not by putting the plugin's folder on sys.path: a pip build leaves
# meshd_prometheus.egg-info there, and its entry point would then show up in other tests' plugin loads.
_PLUGIN_FILE = Path(__file__).resolve().parents[2] / "plugins" / "meshd-prometheus" / "meshd_prometheus.py"
_SPEC = importlib.util.spec_from_file_location("meshd_prometheus", _PLUGIN_FILE)
assert _SPEC is not None and _SPEC.loader is not None
mp = importlib.util.module_from_spec(_SPEC)
sys.modules["meshd_prometheus"] = mp
_SPEC.loader.exec_module(mp)

SNAPSHOT = MetricsSnapshot(
    node_id="n1d", name='host "a"\n', mesh="m", uptime_s=12.5,
    peers_by_state={"online": 2, "stale": 1},
    local_agents_by_state={"online": 1},
    agent_telemetry={"asker": {"queue_depth": 3, "context_used_pct": 41.5}, "quiet": {}},
    qos1_pending=4, qos1_in_flight=2, dead_letters_total=7,
    events={"forwarded": 9, "delivered": 8, "routed": 100},
    plugin_queue=1, plugin_stats={"called": 5, "dropped": 0},
)


class FakeView:
    """The smallest NodeView: a fixed identity and one frozen snapshot."""

    node_id = "n1d"
    name = "a"
    mesh = "m"

    def metrics_snapshot(self) -> MetricsSnapshot:
        return SNAPSHOT

    def info(self) -> dict[str, Any]:
        return {}

    def agents(self) -> list[dict[str, Any]]:
        return []

    def peers(self) -> list[dict[str, Any]]:
        return []

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        return []


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(metrics: mp.Metrics, view: NodeView | None) -> tuple[Samples, dict[str, str]]:
    registry = CollectorRegistry()
    registry.register(mp.MeshdCollector(metrics, lambda: view))
    text = generate_latest(registry).decode()
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return samples, types


def v(samples: Samples, metric: str, **labels: str) -> float | None:
    return samples.get((metric, frozenset(labels.items())))


def test_the_fake_view_is_a_node_view() -> None:
    assert isinstance(FakeView(), NodeView)


def test_node_families_come_from_the_snapshot_only() -> None:
    s, types = scrape(mp.Metrics(), FakeView())
    assert v(s, "meshd_node_info", node="n1d", name='host "a"\n', mesh="m") == 1, "labels escaped and back"
    assert v(s, "meshd_uptime_seconds") == 12.5
    assert v(s, "meshd_peers", state="online") == 2
    assert v(s, "meshd_peers", state="stale") == 1
    assert v(s, "meshd_peers", state="offline") == 0, "every state is exported, absent ones as 0"
    assert v(s, "meshd_local_agents", state="online") == 1
    assert v(s, "meshd_agent_queue_depth", agent="asker") == 3
    assert v(s, "meshd_agent_context_used_percent", agent="asker") == 41.5
    assert v(s, "meshd_agent_queue_depth", agent="quiet") is None, "no telemetry, no sample"
    assert v(s, "meshd_qos1_pending") == 4 and v(s, "meshd_qos1_in_flight") == 2
    assert v(s, "meshd_node_dead_letters_total") == 7
    assert v(s, "meshd_node_events_total", event="forwarded") == 9
    assert v(s, "meshd_node_events_total", event="malformed") == 0, "listed events default to 0"
    assert v(s, "meshd_node_events_total", event="routed") is None, "only the documented events"
    assert v(s, "meshd_plugin_queue_depth") == 1
    assert v(s, "meshd_plugin_events_total", event="called") == 5
    assert types["meshd_node_events"] == "counter" and types["meshd_peers"] == "gauge"


def test_without_a_node_only_the_hook_counters_are_collected() -> None:
    s, _ = scrape(mp.Metrics(), None)
    assert not any(name.startswith(("meshd_peers", "meshd_node_")) for name, _ in s)


class SnapshotView(FakeView):
    def __init__(self, snap: MetricsSnapshot) -> None:
        self.snap = snap

    def metrics_snapshot(self) -> MetricsSnapshot:
        return self.snap


def test_collaborations_histogram_and_quantiles_come_from_the_nodes_tally() -> None:
    """The node counts collaborations itself (meshd.delivery.outcomes.Tally); the plugin renders
    the snapshot's counts and histograms, and its own counters for the rare observer events."""
    tally = Tally()
    for ms in (0.2, 3, 3, 40, 40_000):
        tally.add("request", "ok", latency_ms=ms)
    tally.add("request", "error", "NO_SUCH_AGENT", latency_ms=1)
    tally.add("send", "sent", n=50)  # a batch of sends, counted from its header: no latency
    snap = dataclasses.replace(SNAPSHOT, collaborations=dict(tally.counts),
                               collaboration_errors=dict(tally.errors), latency=tally.readings())
    m = mp.Metrics()
    m.dead_letter({"reason": "NO_SUCH_AGENT"})
    m.peer_state("online")
    m.agent_state("stale")
    s, types = scrape(m, SnapshotView(snap))
    assert types["meshd_request_latency_seconds"] == "histogram"
    assert v(s, "meshd_collaborations_total", kind="request", outcome="ok") == 5
    assert v(s, "meshd_collaborations_total", kind="send", outcome="sent") == 50
    assert v(s, "meshd_collaboration_errors_total", kind="request", code="NO_SUCH_AGENT") == 1
    assert v(s, "meshd_dead_letters_total", reason="NO_SUCH_AGENT") == 1
    assert v(s, "meshd_peer_state_changes_total", state="online") == 1
    assert v(s, "meshd_agent_state_changes_total", state="stale") == 1
    buckets = sorted((float(dict(labels)["le"]), n) for (name, labels), n in s.items()
                     if name == "meshd_request_latency_seconds_bucket" and ("kind", "request") in labels)
    assert [b for b, _ in buckets] == [*LATENCY_BUCKETS_S, float("inf")]
    assert all(x[1] <= y[1] for x, y in itertools.pairwise(buckets)), "cumulative"
    assert v(s, "meshd_request_latency_seconds_bucket", kind="request", le="0.0005") == 1
    assert v(s, "meshd_request_latency_seconds_bucket", kind="request", le="30.0") == 5, "40 s is past 30"
    assert buckets[-1][1] == v(s, "meshd_request_latency_seconds_count", kind="request") == 6
    assert v(s, "meshd_request_latency_seconds_sum", kind="request") == pytest.approx(40.0472)
    assert v(s, "meshd_request_latency_seconds_count", kind="send") is None
    p50 = v(s, "meshd_request_latency_recent_seconds", kind="request", quantile="0.5")
    p99 = v(s, "meshd_request_latency_recent_seconds", kind="request", quantile="0.99")
    assert p50 == pytest.approx(0.003) and p99 == pytest.approx(40.0)


def test_the_tally_is_bounded() -> None:
    tally = Tally()
    for i in range(MAX_TALLY_KEYS + 10):
        tally.add("request", "error", f"CODE_{i}")  # error codes can come from peers
    assert len(tally.errors) == MAX_TALLY_KEYS + 1 and tally.errors[("other", "other")] == 10
    for _ in range(LATENCY_WINDOW + 5):
        tally.add("request", "ok", latency_ms=1.0)
    assert len(tally.readings()["request"].recent_s) == LATENCY_WINDOW


def test_the_plugin_observes_no_collaboration() -> None:
    """An observer of meshd_collaboration gets an event per message (the routing path pays):
    the metrics plugin reads the node's tally instead."""
    assert not hasattr(mp, "meshd_collaboration")


def test_label_values_are_capped() -> None:
    m = mp.Metrics()
    for i in range(mp.MAX_LABEL_VALUES + 10):
        m.dead_letter({"reason": f"r{i}"})
    s, _ = scrape(m, None)
    reasons = {dict(labels)["reason"] for name, labels in s if name == "meshd_dead_letters_total"}
    assert len(reasons) == mp.MAX_LABEL_VALUES + 1 and "other" in reasons
    assert v(s, "meshd_dead_letters_total", reason="other") == 10


def test_the_exporter_refuses_a_node_without_node_view() -> None:
    with pytest.raises(TypeError, match="NodeView"):
        mp.Exporter(mp.Metrics()).start(object())  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["not-a-port", "70000", "-1"])
def test_a_bad_port_is_a_clear_error(raw: str) -> None:
    with pytest.raises(ValueError, match=mp.PORT_ENV):
        mp.Exporter.configured_address({mp.PORT_ENV: raw})
