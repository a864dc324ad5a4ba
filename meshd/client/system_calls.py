"""The client's calls to its daemon's system agent (``meshd.sys.<node>``): the syscall tools.

Owns: one request to the local system agent, retried while that agent is not registered yet
(just after the daemon started). ``Agent.tools`` and ``Agent.call_tool`` (meshd/client/agent.py) use it.

Must not touch: the Agent's sockets, futures or handlers; it only calls ``Agent.request``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshd.errors import NoSuchAgent
from meshd.wire.protocol import DAEMON_PREFIX

if TYPE_CHECKING:
    from meshd.client.agent import Agent

__all__ = ["system_request"]


async def system_request(agent: Agent, topic: str, payload: Any, timeout: float, *,
                         on_progress: Callable[[str], Any] | None = None,
                         headers: dict[str, Any] | None = None) -> Any:
    """A request to ``agent``'s daemon's system agent, answered within ``timeout``.

    Just after the daemon started, its system agent may not be registered yet: the daemon then
    refuses the request with NO_SUCH_AGENT (nothing was delivered), which is retried within
    ``timeout``. A NO_SUCH_AGENT that the system agent itself answers (a tool such as
    ``request_agent`` asked for an agent that does not exist) is the tool's answer and is raised
    at once (not after the whole timeout). ``on_progress(note)`` sees the progress notes the tool sends."""
    from meshd.wire.system_names import system_agent_name  # here: importing meshd.tools loads pydantic

    end = time.monotonic() + timeout
    delay = 0.02
    while True:
        try:
            return await agent.request(system_agent_name(str(agent.node)), topic, payload,
                                       timeout=max(end - time.monotonic(), 0.001), on_progress=on_progress,
                                       headers=headers)
        except NoSuchAgent as exc:
            if not (exc.sender or "").startswith(DAEMON_PREFIX) or time.monotonic() + delay >= end:
                raise  # the tool's own answer (the system agent sent it), or out of time
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
