"""Plans: compile a dependency DAG of tasks and check it before anything runs.

Owns the pure part of plans: validating the caller's task list (ids, capabilities, known deps,
no cycles, the size bound) and putting it in a dependency order; and the plan status rules
(which dependants a finished task makes ready or fails, and what state the plan is in). No
sockets, no store: :mod:`meshd.tasks.service` applies what these functions decide.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from meshd.errors import ValidationFailed

__all__ = ["PlanItem", "compile_plan", "plan_state"]

_KEY_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_MAX_TITLE = 500


@dataclass(frozen=True)
class PlanItem:
    """One checked task of a plan, as the caller named it."""

    key: str
    title: str
    capability: str
    input: Any
    deps: tuple[str, ...] = field(default_factory=tuple)


def _field(index: int, item: dict[str, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValidationFailed(f"tasks[{index}].{name}: a non-empty string is required")
    return value.strip()


def compile_plan(tasks: Any, *, max_tasks: int) -> list[PlanItem]:
    """Check ``tasks`` and return them in a dependency order (every task after its deps).

    ``tasks`` is a list of ``{"id", "title", "capability", "input", "deps"}`` maps. Raises
    :class:`ValidationFailed` naming the first problem: not a list, empty, more than
    ``max_tasks``, a missing or duplicate id, a missing title or capability, a dependency on an
    id not in the plan, a task depending on itself, or a cycle (named as a path).
    """
    if not isinstance(tasks, list):
        raise ValidationFailed("tasks: a list of tasks is required")
    if not tasks:
        raise ValidationFailed("tasks: a plan needs at least one task")
    if len(tasks) > max_tasks:
        raise ValidationFailed(f"tasks: {len(tasks)} tasks exceed tasks.max_plan_tasks = {max_tasks}")
    items: dict[str, PlanItem] = {}
    for index, raw in enumerate(tasks):
        if not isinstance(raw, dict):
            raise ValidationFailed(f"tasks[{index}]: a map is required")
        key = raw.get("id")
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValidationFailed(f"tasks[{index}].id: 1-64 characters of A-Z a-z 0-9 _ . : - required")
        if key in items:
            raise ValidationFailed(f"tasks[{index}].id: {key!r} is used twice")
        title = _field(index, raw, "title")[:_MAX_TITLE]
        capability = _field(index, raw, "capability")
        deps_raw = raw.get("deps", [])
        if deps_raw is None:
            deps_raw = []
        if not isinstance(deps_raw, list) or not all(isinstance(d, str) for d in deps_raw):
            raise ValidationFailed(f"tasks[{index}].deps: a list of task ids is required")
        if key in deps_raw:
            raise ValidationFailed(f"tasks[{index}].deps: task {key!r} depends on itself")
        items[key] = PlanItem(key, title, capability, raw.get("input"), tuple(dict.fromkeys(deps_raw)))
    for index, item in enumerate(items.values()):
        for dep in item.deps:
            if dep not in items:
                raise ValidationFailed(
                    f"tasks[{index}].deps: unknown dependency {dep!r} of task {item.key!r}")
    return _topological(items)


def _topological(items: dict[str, PlanItem]) -> list[PlanItem]:
    """Kahn's algorithm, stable in the caller's order; a leftover means a cycle, which is named."""
    waiting = {key: len(item.deps) for key, item in items.items()}
    dependants: dict[str, list[str]] = {key: [] for key in items}
    for item in items.values():
        for dep in item.deps:
            dependants[dep].append(item.key)
    ready = [key for key, n in waiting.items() if n == 0]
    order: list[PlanItem] = []
    while ready:
        key = ready.pop(0)
        order.append(items[key])
        for child in dependants[key]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if len(order) < len(items):
        left = {key for key, n in waiting.items() if n > 0}
        raise ValidationFailed(f"tasks: dependency cycle {' -> '.join(_find_cycle(items, left))}")
    return order


def _find_cycle(items: dict[str, PlanItem], left: set[str]) -> list[str]:
    """One cycle among ``left`` (every node there has a dep in ``left``), as a closed path in which
    each task depends on the next."""
    start = min(left)
    path = [start]
    seen = {start: 0}
    node = start
    while True:
        node = next(d for d in items[node].deps if d in left)
        if node in seen:
            return [*path[seen[node]:], node]
        seen[node] = len(path)
        path.append(node)


def plan_state(task_states: list[str]) -> str:
    """The plan's state from its tasks' states: done, failed, cancelled or running."""
    counts = Counter(task_states)
    if not task_states or counts["done"] == len(task_states):
        return "done"
    if counts["pending"] or counts["ready"] or counts["running"]:
        return "running"
    if counts["failed"]:
        return "failed"
    return "cancelled"
