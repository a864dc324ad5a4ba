"""Names the tool layer and its callers agree on: the system agent's name and its request topics.

Owns only constants (no imports), so the client library can use them without pulling in the tool
machinery. Must not hold behaviour.
"""

from __future__ import annotations

from typing import Final

#: Agent names starting with this are reserved for daemons' system agents; the node refuses them
#: from any other connection.
SYSTEM_PREFIX: Final = "meshd.sys."
#: Request topic: list the tools (payload: nothing; reply: list of tool descriptions).
TOPIC_LIST: Final = "meshd.tools.list"
#: Request topic: call a tool (payload: ``{"name": str, "args": map}``; reply: the tool's result).
TOPIC_CALL: Final = "meshd.tools.call"
#: Request topic: held approvals (payload: ``{"op": "list"|"allow"|"deny", "id": str, "reason": str}``).
TOPIC_APPROVALS: Final = "meshd.tools.approvals"
#: Topic the answers to ``ask_agent`` questions are sent on, to the agent that asked.
TOPIC_ANSWER: Final = "meshd.answer"
#: Topic task and spawn events are published on (``meshctl tail meshd.tasks``).
TOPIC_TASK_EVENTS: Final = "meshd.tasks"
#: A ``to`` starting with this is a virtual address a content-routing plugin resolves at the
#: sender's daemon (``meshd_route``, meshd/delivery/content_routes.py).
ROUTE_PREFIX: Final = "route:"
#: Application header naming the agent a tool acted for, on messages a tool sends.
CALLER_HEADER: Final = "meshd-caller"


def system_agent_name(node_id: str) -> str:
    """The name of the system agent of the daemon whose node id is ``node_id``."""
    return SYSTEM_PREFIX + node_id
