"""``meshd a2a``: the A2A 1.0 binding, on the official ``a2a-sdk``, attached to the local daemon.

Every exposed mesh agent is an A2A agent (an Agent Card, JSON-RPC and HTTP+JSON, tasks), and every
configured external A2A agent is a mesh agent (docs/a2a.md). Modules: ``parts`` (mesh payloads and
errors as A2A parts and task states: the documented table), ``cards`` (Agent Cards and the
catalog), ``store`` (the bounded task store), ``executor`` (an A2A message becomes a mesh request),
``server`` (the HTTP app: routes, bearer token, uvicorn), ``remote`` (external agents joining the
mesh), ``run`` (``meshd a2a``'s options and lifetime). The SDK is imported only by those modules,
and they only by ``meshd a2a``: the daemon never loads it.

May import: ``client``, ``config``, ``wire``, ``util``, ``errors`` and ``bindings.mcp_http`` (the
listen-address and token-file helpers). Never ``daemon`` or ``cli``.
"""
