"""The HTTP/SSE gateway and live dashboard (docs/http.md): agents in any language join the mesh.

Importing this package imports aiohttp; ``import meshd`` and the agent client never do (the
daemon imports it only when ``http`` is on). ``meshd.gateway.auth`` alone does not need aiohttp,
so meshctl can find a gateway's URL and token without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import Gateway

__all__ = ["Gateway"]


def __getattr__(name: str) -> Any:
    if name == "Gateway":  # lazily: meshd.gateway.auth must not pull in aiohttp
        from .service import Gateway

        return Gateway
    raise AttributeError(name)
