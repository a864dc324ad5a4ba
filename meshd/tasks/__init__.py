"""Tasks and plans: a daemon's durable task store, the scheduler, plans, and the worker side.

Owns nothing itself; re-exports the public names of its modules (see docs/tasks.md):
:class:`TaskService` (what the tools call), :class:`TaskWorker` and :class:`TaskCall` (what an
agent uses to take tasks), and the topics tasks travel on.
"""

from __future__ import annotations

from .scheduler import TASK_TOPIC
from .service import REPLAN_TOPIC, TaskService
from .store import FINISHED, STATES
from .worker import TaskCall, TaskWorker

__all__ = ["FINISHED", "REPLAN_TOPIC", "STATES", "TASK_TOPIC", "TaskCall", "TaskService", "TaskWorker"]
