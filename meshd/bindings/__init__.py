"""Bindings: the standards other frameworks speak, attached to the local daemon as agents.

Holds the MCP server (``mcp``: ``meshd mcp``, on the official ``mcp`` SDK). Each binding runs in
its own process and uses the agent library like any other agent.

May import: ``client``, ``tools`` (names, schemas), ``config``, ``wire``, ``util``, ``errors``.
Never ``daemon`` or ``cli``.
"""
