"""Node implements the NodeView contract plugins get; the metrics snapshot is safe to read early."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from meshd.config.settings import Settings
from meshd.daemon.node import START_STEPS, STOP_STEPS, Node
from meshd.hookspecs import hookimpl
from meshd.view import MetricsSnapshot, NodeView


def test_node_is_a_node_view(tmp_path: Path) -> None:
    node = Node(Settings(state_dir=tmp_path, insecure=True, interfaces=["127.0.0.1"]))
    assert isinstance(node, NodeView)
    assert node.mesh == node.settings.mesh and node.name == node.settings.name


def test_metrics_snapshot_from_another_thread_before_start(tmp_path: Path) -> None:
    node = Node(Settings(state_dir=tmp_path, insecure=True, interfaces=["127.0.0.1"]))
    seen: list[MetricsSnapshot] = []
    reader = threading.Thread(target=lambda: seen.append(node.metrics_snapshot()))
    reader.start()
    reader.join(5)
    assert len(seen) == 1 and seen[0].mesh == node.settings.mesh and seen[0].qos1_pending == 0
    node._take_snapshot()  # what the loop does every second
    snap = node.metrics_snapshot()
    assert snap is not seen[0]
    assert snap.peers_by_state == {"online": 0, "one-way": 0, "stale": 0, "offline": 0}


def test_every_step_has_its_methods() -> None:
    for step in START_STEPS:
        assert callable(getattr(Node, f"_start_{step}", None)), step
    for step in STOP_STEPS:
        assert callable(getattr(Node, f"_stop_{step}", None)), step


class _Observer:
    @hookimpl
    def meshd_collaboration(self, outcome: dict[str, Any]) -> None:
        pass


def test_outcome_tracking_follows_plugins_registered_at_run_time(tmp_path: Path) -> None:
    node = Node(Settings(state_dir=tmp_path, insecure=True, interfaces=["127.0.0.1"]))
    try:
        assert node.outcomes.enabled is False
        node.plugins.register(_Observer(), "dashboard")
        assert node.outcomes.enabled is True
        assert node.plugins.unregister("dashboard") is True
        assert node.outcomes.enabled is False
    finally:
        node.plugins.stop(timeout=2)


def test_dead_letters_newest_first_bounded_by_limit(tmp_path: Path) -> None:
    node = Node(Settings(state_dir=tmp_path, insecure=True, interfaces=["127.0.0.1"]))
    try:
        assert node.dead_letters() == []
        for i in range(3):
            node.record_dead_letter("TASK_FAILED", f"task {i} failed", {"kind": "task", "from": "boss"})
        letters = node.dead_letters(2)
        assert [d["detail"] for d in letters] == ["task 1 failed", "task 2 failed"]  # oldest first
        assert letters[0]["reason"] == "TASK_FAILED" and letters[0]["from"] == "boss"
        assert letters[0]["kind"] == "task" and letters[0]["bytes"] == 0
        assert len(node.dead_letters()) == 3 and node.dead_letters(0) == []
        node._take_snapshot()
        assert node.metrics_snapshot().dead_letters_total == 3
    finally:
        node.plugins.stop(timeout=2)
