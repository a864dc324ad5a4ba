"""The HTTP/SSE gateway and live dashboard (docs/http.md): agents in any language join the mesh.

Importing this package imports aiohttp; ``import meshd`` and the agent client never do (the
daemon imports it only when ``http`` is on). ``meshd.gateway.auth`` alone does not need aiohttp,
so meshctl can find a gateway's URL and token without it.

May import: ``tools``, ``client``, daemon parts, ``config``, ``wire``, ``util``, ``errors``.
Never ``daemon`` or ``cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshd.gateway.service import Gateway

__all__ = ["Gateway"]


def __getattr__(name: str) -> Any:
    if name == "Gateway":  # lazily: meshd.gateway.auth must not pull in aiohttp
        from meshd.gateway.service import Gateway

        return Gateway
    raise AttributeError(name)
