"""Tasks and plans: a daemon's durable task store, the scheduler, plans, and the worker side.

Owns nothing itself; re-exports the public names of its modules (see docs/tasks.md):
:class:`TaskService` (what the tools call), :class:`TaskWorker` and :class:`TaskCall` (what an
agent uses to take tasks), and the topics tasks travel on.

May import: ``client``, daemon parts (``plugins``, ``mesh``...), ``config``, ``wire``, ``util``,
``errors``. Never ``daemon`` or ``cli``.
"""

from __future__ import annotations

from meshd.tasks.scheduler import TASK_TOPIC
from meshd.tasks.service import REPLAN_TOPIC, TaskService
from meshd.tasks.store import FINISHED, STATES
from meshd.tasks.worker import TaskCall, TaskWorker

__all__ = ["FINISHED", "REPLAN_TOPIC", "STATES", "TASK_TOPIC", "TaskCall", "TaskService", "TaskWorker"]
