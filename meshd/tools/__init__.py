"""Syscall tools: LLM-callable tools that act through the mesh, hosted by each daemon's system agent.

Owns the public names of the tool layer (re-exported here for plugin authors): :class:`Tool` and
:class:`ToolContext`. The machinery lives in its own modules: ``registry`` (tools and their
schemas; approvals, quotas and authorization are :mod:`meshd.plugins.policy`), ``builtin`` (the
built-in tools), ``service`` (the system agent), ``spawn`` (agents started from templates).
Importing this package must stay cheap: it does not import the client or the node.

May import: ``tasks``, ``client``, daemon parts, ``config``, ``wire``, ``util``, ``errors``.
Never ``daemon`` or ``cli``.
"""

from __future__ import annotations

from meshd.tools.registry import SCHEMA_FORMATS, Tool, ToolContext, ToolRegistry
from meshd.wire.system_names import SYSTEM_PREFIX, system_agent_name

__all__ = ["SCHEMA_FORMATS", "SYSTEM_PREFIX", "Tool", "ToolContext", "ToolRegistry", "system_agent_name"]
