"""Content-based routing: the agent a message to a virtual ``route:<name>`` address goes to.

Owns: asking ``meshd_route`` (through the plugin host) for each ``send`` or ``request`` a local
agent addresses to ``route:<name>``, with the message's headers (and its decoded payload only
for routes whose plugin asked for it, ``meshd_route_payload``, remembered per route name), the
rewritten header (``to`` = the chosen agent; the one header a daemon re-encodes for this), the
request ids routed that way and where they went (bounded by ``route_memory``), so that a cancel
to the same ``route:`` address follows its request; and the counters ``routed``,
``route_unchosen``, ``route_payload_decoded``.

Must not touch: sockets, the directory, the decision itself (the plugin's); the ``Router``
composes this and routes what it returns.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind
from meshd.wire.system_names import ROUTE_PREFIX

if TYPE_CHECKING:
    from meshd.plugins.host import PluginHost

__all__ = ["ROUTE_PREFIX", "ContentRoutes"]

PAYLOAD_ROUTES_MAX = 1024
"""Route names whose payload answer is remembered; past it the memory starts again."""


class ContentRoutes:
    """The sender's daemon's side of content routing (only built when a plugin has ``meshd_route``)."""

    def __init__(self, plugins: PluginHost, stats: Counter[str], *, memory: int,
                 max_payload_bytes: int) -> None:
        self.plugins = plugins
        self.stats = stats
        self.memory = memory
        self.max_payload_bytes = max_payload_bytes
        self._wants_payload: dict[str, bool] = {}
        #: request id -> the agent it was routed to (a cancel with that corr follows it)
        self._routed: OrderedDict[str, str] = OrderedDict()

    def choose(self, header: P.Header, payload: bytes) -> str | None:
        """The agent a ``send`` or ``request`` (or a qos-1 batch, as one unit) to
        ``route:<name>`` goes to, or None (nobody chose)."""
        route = str(header.to)[len(ROUTE_PREFIX):]
        shown: Mapping[str, Any] = header.fields
        headers = shown.get(P.HEADERS)
        message: dict[str, Any] = {
            "kind": shown.get(P.KIND), "id": shown.get(P.ID), "from": header.sender,
            "topic": shown.get(P.TOPIC, header.topic),
            "headers": dict(headers) if isinstance(headers, dict) else {},
            "qos": header.qos, "priority": shown.get(P.PRIO, P.DEFAULT_PRIORITY),
        }
        wants = self._wants_payload.get(route)
        if wants is None:
            if len(self._wants_payload) >= PAYLOAD_ROUTES_MAX:
                self._wants_payload.clear()
            wants = self._wants_payload[route] = self.plugins.route_payload(route)
        if wants:
            self.stats["route_payload_decoded"] += 1
            try:
                message["payload"] = P.unpack_body(payload, self.max_payload_bytes)
            except FrameError as exc:
                message["payload"] = None
                message["payload_error"] = str(exc)
        chosen = self.plugins.route(route, message)
        if not isinstance(chosen, str) or not chosen or chosen.startswith(ROUTE_PREFIX):
            self.stats["route_unchosen"] += 1
            return None
        self.stats["routed"] += 1
        if message["kind"] == Kind.REQUEST and isinstance(message["id"], str):
            self._routed[message["id"]] = chosen
            if len(self._routed) > self.memory:
                self._routed.popitem(last=False)
        return chosen

    def cancel_target(self, corr: str | None) -> str | None:
        """Where the request a cancel names was routed (None: not one of ours, or forgotten)."""
        return self._routed.get(corr) if corr is not None else None

    def forget(self, corr: str | None) -> None:
        if corr is not None:
            self._routed.pop(corr, None)


def readdressed(header: P.Header, frames: list[bytes], to: str) -> tuple[P.Header, list[bytes]]:
    """``frames`` (``[rid, signature, header, payload]``) with ``to`` rewritten: the header
    re-encoded once (it was range-checked at the edge already)."""
    fields = dict(header.fields)
    fields[P.TO] = to
    return P.header_from_map(fields), [frames[0], frames[1], P.pack(fields), *frames[3:]]
