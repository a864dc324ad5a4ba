"""The agent's session with its daemon: registering (and applying what the answer says), registering
again after a daemon restart, and the heartbeat loop.

Owns: reading the ``register`` answer (docs/PROTOCOL.md §15.1) into the client's bounds (the
publish window, the calls in flight, the handler slots' parking, the heartbeat interval) and the
periodic sweep of control calls that got no answer. Must not touch: sockets (it goes through the
``Agent``'s ``_control`` and ``heartbeat``), handlers, batching.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from meshd.errors import DaemonUnreachable
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind

if TYPE_CHECKING:
    from meshd.client.agent import Agent


async def register(agent: Agent) -> None:
    """Register ``agent``'s name and fit its bounds to what the daemon's answer says."""
    body = {"name": agent.name, "capabilities": agent.capabilities, "metadata": agent.metadata}
    info = await agent._control({P.KIND: Kind.REGISTER}, body)
    if isinstance(info, dict):
        agent.node = info.get("node")
        agent.node_name = info.get("node_name")
        agent._window.fit_daemon(info.get("in_flight_max"))
        beat = info.get("heartbeat_interval")  # PROTOCOL.md §8.2: beat at least this often
        if isinstance(beat, (int, float)) and not isinstance(beat, bool) \
                and 0 < beat < agent.heartbeat_interval:
            agent.heartbeat_interval = float(beat)
        agent._handler_slots.fit_daemon(info.get("inbox_cap"))
        agent._calls.fit_daemon(info.get("in_flight_max"), agent._window.size)


async def reregister(agent: Agent) -> None:
    """Register again and restore the subscriptions (``ResendHold.reregister`` retries it)."""
    await register(agent)
    for topic, durable in list(agent._topics.items()):
        header: dict[str, Any] = {P.KIND: Kind.SUBSCRIBE, P.TOPIC: topic}
        if durable:
            header[P.QOS] = 1
        await agent._control(header)


async def heartbeat_loop(agent: Agent) -> None:
    """Every ``heartbeat_interval``: expire control calls that got no answer, and beat."""
    while not agent._closed and agent.evicted is None:
        await asyncio.sleep(agent.heartbeat_interval)
        now = time.monotonic()
        for msg_id, deadline in list(agent._expiring.items()):
            if deadline < now:
                agent._expire_control(msg_id)
        if agent.auto_heartbeat:
            try:
                agent.heartbeat()
            except DaemonUnreachable:  # an embedded node that stopped: calls raise it too
                return
