"""Agent Cards for mesh agents, and the catalog of them all.

One ``meshd a2a`` serves many agents behind one host, the way A2A 1.0 provides for it: each
card's interfaces (JSON-RPC and HTTP+JSON) carry the agent's name as their ``tenant``, so the
SDK's client adds it to every call; the cards live at ``/agents/NAME/.well-known/agent-card.json``
and the catalog of all of them at ``/.well-known/ai-catalog.json`` (docs/a2a.md, "URLs"). Skills
come from the agent's capabilities. Owns the shape of cards and catalog only.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    MutualTlsSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0

from meshd.wire.system_names import SYSTEM_PREFIX

__all__ = ["CARD_PATH", "CATALOG_PATH", "HOST_CARD_PATH", "JSONRPC_PATH", "REST_PATH", "SAFE_NAME",
           "CardMaker", "exposed"]

CARD_PATH: Final = "/agents/{name}/.well-known/agent-card.json"
HOST_CARD_PATH: Final = "/.well-known/agent-card.json"  # a2a.default_agent's card, without a tenant
CATALOG_PATH: Final = "/.well-known/ai-catalog.json"
JSONRPC_PATH: Final = "/a2a/jsonrpc"
REST_PATH: Final = "/a2a/rest"
#: Names an A2A tenant can carry in a URL path as they are (RFC 3986 unreserved characters); an
#: agent whose name has others is not served (the SDK's client puts the tenant in paths unescaped).
SAFE_NAME: Final = re.compile(r"[A-Za-z0-9._~-]{1,128}")
MAX_SKILLS: Final = 64


def exposed(name: str, patterns: list[str], own: set[str]) -> bool:
    """Whether ``name`` is served as an A2A agent: it matches a pattern, is a URL-safe name, is
    no daemon's system agent and none of this binding's own agents (no loops)."""
    return (bool(SAFE_NAME.fullmatch(name)) and not name.startswith(SYSTEM_PREFIX) and name not in own
            and any(fnmatch.fnmatchcase(name, p) for p in patterns))


@dataclass(frozen=True, slots=True)
class CardMaker:
    """Builds the cards of one server: its base URL, how clients authenticate (a bearer
    token, or the TLS client certificate scheme when ``mtls``) and, with ``signer``
    (meshd/bindings/a2a/signing.py), each card signed."""

    base_url: str
    bearer: bool = True
    mtls: bool = False
    signer: Callable[[AgentCard], AgentCard] | None = None

    def _security(self) -> tuple[dict[str, SecurityScheme], list[SecurityRequirement]]:
        schemes: dict[str, SecurityScheme] = {}
        if self.bearer:
            schemes["bearer"] = SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="Bearer", description="The token in meshd a2a's token file (a2a-NAME.token)."))
        if self.mtls:
            schemes["mtls"] = SecurityScheme(mtls_security_scheme=MutualTlsSecurityScheme(
                description="A TLS client certificate the server's CA signed."))
        return schemes, [SecurityRequirement(schemes={k: StringList()}) for k in schemes]

    def card_url(self, name: str) -> str:
        return self.base_url + CARD_PATH.format(name=name)

    def card(self, record: dict[str, Any], *, tenant: bool = True) -> AgentCard:
        """The card of one agent record (as ``Agent.agents()`` lists it); ``tenant=False``: the
        host's own card (``a2a.default_agent``), whose interfaces name no tenant."""
        name = str(record["name"])
        raw = record.get("metadata")
        meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
        caps = [str(c) for c in (record.get("capabilities") or [])][:MAX_SKILLS]
        description = str(meta.get("description") or
                          f"meshd agent {name} on {record.get('node_name') or record.get('node')}")
        skills = [AgentSkill(id=c, name=c, description=f"{name}'s capability {c!r}", tags=[c]) for c in caps]
        if not skills:
            skills = [AgentSkill(id="message", name="message", description=f"Send {name} a message.",
                                 tags=["meshd"])]
        schemes, requirements = self._security()
        interfaces = [
            AgentInterface(url=self.base_url + JSONRPC_PATH, protocol_binding="JSONRPC",
                           tenant=name if tenant else "", protocol_version=PROTOCOL_VERSION_1_0),
            AgentInterface(url=self.base_url + REST_PATH, protocol_binding="HTTP+JSON",
                           tenant=name if tenant else "", protocol_version=PROTOCOL_VERSION_1_0),
        ]
        if not tenant:  # A2A 0.3 has no tenants: its clients reach the host's own agent only
            interfaces += [
                AgentInterface(url=self.base_url + JSONRPC_PATH, protocol_binding="JSONRPC",
                               protocol_version=PROTOCOL_VERSION_0_3),
                AgentInterface(url=self.base_url + REST_PATH, protocol_binding="HTTP+JSON",
                               protocol_version=PROTOCOL_VERSION_0_3)]
        card = AgentCard(
            name=name, description=description[:1000], version=str(meta.get("version") or "1"),
            supported_interfaces=interfaces,
            provider=AgentProvider(organization="meshd", url=self.base_url),
            capabilities=AgentCapabilities(streaming=True, push_notifications=False),
            security_schemes=schemes, security_requirements=requirements,
            default_input_modes=["text/plain", "application/json"],
            default_output_modes=["text/plain", "application/json"], skills=skills)
        return self.signer(card) if self.signer is not None else card

    def catalog(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """``/.well-known/ai-catalog.json``: every served agent, with its card's URL."""
        return {"version": "1.0", "host": {"name": "meshd", "url": self.base_url},
                "agents": [{"name": r["name"], "description": self.card(r).description,
                            "url": self.card_url(str(r["name"])), "protocol": "a2a",
                            "skills": [str(c) for c in (r.get("capabilities") or [])][:MAX_SKILLS],
                            "state": r.get("state")} for r in records]}
