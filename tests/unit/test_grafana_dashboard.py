"""The ready Grafana dashboard (plugins/meshd-prometheus/grafana-dashboard.json) queries only
metrics the plugin exports: a renamed metric fails here, not on someone's wall screen."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from meshd.view import MetricsSnapshot

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "meshd-prometheus"


def test_every_dashboard_query_names_an_exported_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN))
    import meshd_prometheus as mp

    try:
        snap = MetricsSnapshot(node_id="n", name="a", mesh="m", uptime_s=1.0)
        families = {f.name for f in [*mp.Metrics().collect(), *mp.node_families(snap)]}
        exported = families | {f"{n}_{s}" for n in families for s in ("bucket", "sum", "count")} \
            | {f"{n}_total" for n in families}  # counters are named without _total in the family
        dashboard = json.loads((PLUGIN / "grafana-dashboard.json").read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        named = {m for e in exprs for m in re.findall(r"\b(meshd_[a-z0-9_]+)", e)}
        assert len(dashboard["panels"]) >= 6 and named
        assert named <= exported, sorted(named - exported)
        for wanted in ("meshd_messages_total", "meshd_request_latency_seconds_bucket",
                       "meshd_dead_letters_total", "meshd_qos1_pending", "meshd_qos1_outbox_depth",
                       "meshd_agent_lag_seconds"):
            assert wanted in named, wanted
    finally:
        sys.modules.pop("meshd_prometheus", None)
