"""An example meshd content-routing plugin: ``route:<name>`` goes to the least-loaded agent.

A message sent to ``route:<name>`` goes to the online agent, anywhere in the mesh, that has the
capability the message asks for and the smallest ``queue_depth`` in its telemetry (then the
smallest ``context_used_pct``, then the name). The capability is:

* the message's ``capability`` application header, when it has one (``headers={"capability":
  "refunds"}``);
* else, for ``route:triage`` only, the payload's ``kind`` field: the one route for which this
  plugin asks the daemon to decode payloads (``meshd_route_payload``), which costs a msgpack
  decode per message on the routing path;
* else the route's own name (``route:invoices`` -> capability ``invoices``).

With no such agent it answers None, and the sender gets NO_SUCH_AGENT naming the route. Both
hooks are called on the daemon's routing path: they only read the directory the daemon already
has (``node.agents()``), and never block.
"""

from __future__ import annotations

from typing import Any

from meshd.hookspecs import hookimpl

PAYLOAD_ROUTE = "triage"

_node: Any = None


def _load(record: dict[str, Any]) -> tuple[float, float, str]:
    telemetry = record.get("telemetry") or {}
    return (float(telemetry.get("queue_depth") or 0), float(telemetry.get("context_used_pct") or 0),
            str(record.get("name")))


@hookimpl
def meshd_startup(node: Any) -> None:
    global _node
    _node = node


@hookimpl
def meshd_shutdown(node: Any) -> None:
    global _node
    _node = None


@hookimpl
def meshd_route_payload(route: str) -> bool | None:
    return True if route == PAYLOAD_ROUTE else None


@hookimpl
def meshd_route(route: str, message: dict[str, Any]) -> str | None:
    if _node is None:
        return None
    capability = message["headers"].get("capability")
    if not isinstance(capability, str) and route == PAYLOAD_ROUTE:
        payload = message.get("payload")
        capability = payload.get("kind") if isinstance(payload, dict) else None
    if not isinstance(capability, str):
        capability = route
    capable = [a for a in _node.agents()
               if a.get("state") == "online" and capability in (a.get("capabilities") or [])]
    if not capable:
        return None
    return str(min(capable, key=_load)["name"])
