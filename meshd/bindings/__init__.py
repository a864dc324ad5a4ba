"""Bindings: the standards other frameworks speak, attached to the local daemon as agents.

Holds the MCP server, ``meshd mcp``, on the official ``mcp`` SDK: ``mcp`` (the bridge to the
mesh, the options, stdio), ``mcp_server`` (the SDK's server: progress, cancel, the inbox's
announcements) and ``mcp_http`` (Streamable HTTP: bearer token, TLS, Host/Origin checks); and the
A2A 1.0 binding, ``meshd a2a``, on the official ``a2a-sdk``, in the ``a2a`` package. Each binding
runs in its own process and uses the agent library like any other agent.

May import: ``client``, ``tools`` (names, schemas), ``config``, ``wire``, ``util``, ``errors``.
Never ``daemon`` or ``cli``.
"""
