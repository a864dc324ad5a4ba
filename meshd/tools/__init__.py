"""Syscall tools: LLM-callable tools that act through the mesh, hosted by each daemon's system agent.

Owns the public names of the tool layer (re-exported here for plugin authors): :class:`Tool` and
:class:`ToolContext`. The machinery lives in its own modules: ``registry`` (tools and their
schemas), ``policy`` (approvals, quotas, authorization), ``builtin`` (the built-in tools),
``service`` (the system agent). Importing this package must stay cheap and must not import the
client or the node.
"""

from __future__ import annotations

from .names import SYSTEM_PREFIX, system_agent_name
from .registry import SCHEMA_FORMATS, Tool, ToolContext, ToolRegistry

__all__ = ["SCHEMA_FORMATS", "SYSTEM_PREFIX", "Tool", "ToolContext", "ToolRegistry", "system_agent_name"]
