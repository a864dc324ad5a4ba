"""The A2A task store: the SDK's in-memory store, scoped by agent and bounded.

Each task belongs to the agent (the A2A tenant) it was sent to, so ``GetTask`` and ``ListTasks``
through one agent's card never show another's. At most ``max_tasks`` are kept: past that, the
oldest finished task is forgotten; when every kept task is still running, a new one is refused
with :func:`store_full` (the client sees an A2A error whose details name
``TASK_STORE_FULL``). Owns the bound and the eviction order only.
"""

from __future__ import annotations

import collections
from typing import Final

from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Task
from a2a.utils.errors import InternalError

__all__ = ["STORE_FULL_CODE", "BoundedTaskStore", "store_full", "tenant_of"]

STORE_FULL_CODE: Final = "TASK_STORE_FULL"


def store_full(cap: int) -> InternalError:
    """Every kept A2A task is still running and the store is at ``a2a.max_tasks``: try later.

    The SDK's own ``InternalError`` (a subclass would reach REST clients as an unknown reason),
    with ``TASK_STORE_FULL`` in its message and in its ``ErrorInfo`` metadata."""
    return InternalError(f"{STORE_FULL_CODE}: {cap} A2A tasks are running (a2a.max_tasks); try later",
                         data={"code": STORE_FULL_CODE, "retry": "true", "max_tasks": str(cap)})


def tenant_of(context: ServerCallContext) -> str:
    """The agent a call is for: its A2A tenant."""
    return context.tenant


class BoundedTaskStore(TaskStore):
    def __init__(self, max_tasks: int) -> None:
        self.max_tasks = max_tasks
        self._inner = InMemoryTaskStore(owner_resolver=tenant_of)
        self._order: collections.OrderedDict[tuple[str, str], bool] = collections.OrderedDict()
        self.refused = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._order)

    async def make_room(self) -> None:
        """Before a new task: forget the oldest finished one if the store is full, or refuse."""
        if len(self._order) < self.max_tasks:
            return
        for key, done in self._order.items():
            if done:
                del self._order[key]
                self.evicted += 1
                await self._inner.delete(key[1], ServerCallContext(tenant=key[0]))
                return
        self.refused += 1
        raise store_full(self.max_tasks)

    async def save(self, task: Task, context: ServerCallContext) -> None:
        key = (tenant_of(context), task.id)
        if key not in self._order:
            await self.make_room()
        self._order[key] = task.status.state in TERMINAL_TASK_STATES
        await self._inner.save(task, context)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self._inner.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self._inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._order.pop((tenant_of(context), task_id), None)
        await self._inner.delete(task_id, context)
