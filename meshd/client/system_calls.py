"""The client's calls to its daemon's system agent (``meshd.sys.<node>``): the syscall tools.

Owns: one request to the local system agent, retried while that agent is not registered yet
(just after the daemon started). ``Agent.tools`` and ``Agent.call_tool`` (meshd/client/agent.py) use it.

Must not touch: the Agent's sockets, futures or handlers; it only calls ``Agent.request``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from meshd.errors import NoSuchAgent

if TYPE_CHECKING:
    from meshd.client.agent import Agent

__all__ = ["system_request"]


async def system_request(agent: Agent, topic: str, payload: Any, timeout: float) -> Any:
    """A request to ``agent``'s daemon's system agent. Just after the daemon started, its system
    agent may not be registered yet: NO_SUCH_AGENT (nothing was delivered) is retried within
    ``timeout``."""
    from meshd.wire.system_names import system_agent_name  # here: importing meshd.tools loads pydantic

    end = time.monotonic() + timeout
    delay = 0.02
    while True:
        try:
            return await agent.request(system_agent_name(str(agent.node)), topic, payload,
                                       timeout=max(end - time.monotonic(), 0.001))
        except NoSuchAgent:
            if time.monotonic() + delay >= end:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
