"""Helper roles for the embedded-node rows: the meshd ``Agent`` roles of roles.py, each in a
process that runs its own node (``meshd.EmbeddedNode``, docs/embedded.md) with the agent attached
in-process. ``cfg["node"]`` holds the node's settings (``EmbeddedNode.from_config`` keywords:
name, mesh, interfaces = 127.0.0.1, state dir, socket, insecure); the rest is the wrapped role's.

Two such processes talk over their mesh link only: agent -> node -> (tcp) -> node -> agent, with
no ipc hop at either end (compare.py's "embedded" rows, beside Zenoh peer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roles import Cfg, mesh_echo, mesh_recv, mesh_rtt, mesh_send


def _embedded(role: Callable[[Cfg], Any]) -> Callable[[Cfg], Any]:
    async def run(cfg: Cfg) -> None:
        from meshd import EmbeddedNode

        async with EmbeddedNode.from_config(**cfg["node"]) as node:
            await role({**cfg, "_node": node})  # roles._agent attaches to it in-process

    run.__name__ = f"emb_{role.__name__}"
    return run


EMBEDDED_ROLES: dict[str, Callable[[Cfg], Any]] = {
    "emb_recv": _embedded(mesh_recv), "emb_send": _embedded(mesh_send),
    "emb_echo": _embedded(mesh_echo), "emb_rtt": _embedded(mesh_rtt),
}
