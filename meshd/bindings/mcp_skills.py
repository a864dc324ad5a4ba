"""Skills as MCP tools: each typed topic of the mesh as a tool of its own.

Owns :class:`SkillTools`: from the directory's contract records (``Agent.agents``), one tool per
agent, typed topic and major version (``researcher__verify``; an older major served beside it
gets ``__v1``), with the contract's ``accepts`` schema as its input schema and its description;
bounded (``max_tools``), filtered (``allow``: shell patterns on the tool name or the agent
name), refreshed from the directory (:meth:`SkillTools.watch` tells when the list changed, so the
server sends ``notifications/tools/list_changed``). Calling one is a request to that agent with
the contract's version. Plain data: no SDK here (meshd/bindings/mcp_server.py speaks MCP).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from meshd.client import Agent
from meshd.errors import MeshError
from meshd.wire.contracts import contracts_digest, parse_version

__all__ = ["SKILL_SEPARATOR", "Skill", "SkillTools"]

log = logging.getLogger("meshd.mcp")

SKILL_SEPARATOR: Final = "__"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_TOOL_NAME: Final = 128
PAYLOAD_KEY: Final = "payload"


@dataclass(frozen=True, slots=True)
class Skill:
    """One typed topic of one agent, as an MCP tool."""

    tool: str
    agent: str
    topic: str
    version: str
    description: str
    input_schema: dict[str, Any]
    #: The accepts schema is not an object: the tool takes ``{"payload": ...}`` and sends that.
    wrapped: bool

    def mcp(self) -> dict[str, Any]:
        return {"name": self.tool, "description": self.description, "inputSchema": self.input_schema}

    def payload(self, args: dict[str, Any]) -> Any:
        return args.get(PAYLOAD_KEY) if self.wrapped else args


def _input_schema(accepts: Any) -> tuple[dict[str, Any], bool]:
    if isinstance(accepts, dict) and accepts.get("type") == "object":
        return accepts, False
    inner = accepts if isinstance(accepts, dict) else {}
    return {"type": "object", "properties": {PAYLOAD_KEY: inner}, "required": [PAYLOAD_KEY]}, True


class SkillTools:
    """The skills of the mesh, as this agent's directory shows them."""

    def __init__(self, agent: Agent, *, max_tools: int = 64, allow: tuple[str, ...] = ()) -> None:
        """``listeners`` (called with no argument, never raising into the refresh) hear each change."""
        self.agent = agent
        self.listeners: list[Callable[[], None]] = []
        self.max_tools = max_tools
        self.allow = allow
        self.skills: dict[str, Skill] = {}
        self.left_out = 0  # skills past ``max_tools`` at the last refresh
        self._digest = ""

    def _allowed(self, tool: str, agent: str) -> bool:
        return not self.allow or any(fnmatch.fnmatchcase(tool, p) or fnmatch.fnmatchcase(agent, p)
                                     for p in self.allow)

    def build(self, records: list[dict[str, Any]]) -> dict[str, Skill]:
        """The skills of these agent records (pure: the unit tests call it)."""
        skills: dict[str, Skill] = {}
        self.left_out = 0
        for rec in sorted(records, key=lambda r: str(r.get("name"))):
            name = rec.get("name")
            contracts = rec.get("contracts")
            if not isinstance(name, str) or name == self.agent.name or not isinstance(contracts, list):
                continue
            newest: dict[str, int] = {}
            for c in contracts:
                v = parse_version(c.get("version")) if isinstance(c, dict) else None
                if v is not None and isinstance(c.get("topic"), str):
                    newest[c["topic"]] = max(newest.get(c["topic"], -1), v[0])
            for c in contracts:
                v = parse_version(c.get("version")) if isinstance(c, dict) else None
                if v is None or c.get("topic") not in newest:
                    continue
                topic = str(c["topic"])
                tool = _UNSAFE.sub("_", f"{name}{SKILL_SEPARATOR}{topic}")
                if v[0] != newest[topic]:
                    tool += f"{SKILL_SEPARATOR}v{v[0]}"
                tool = tool[:MAX_TOOL_NAME]
                if tool in skills or not self._allowed(tool, name):
                    continue
                if len(skills) >= self.max_tools:
                    self.left_out += 1
                    continue
                schema, wrapped = _input_schema(c.get("accepts"))
                text = str(c.get("description") or f"{topic} of agent {name}")
                skills[tool] = Skill(tool, name, topic, str(c["version"]),
                                     f"{text} (skill {topic!r} v{c['version']} of mesh agent {name!r}; "
                                     "a request to it)", schema, wrapped)
        return skills

    async def refresh(self) -> bool:
        """Read the directory again; when the skills changed, tell the listeners and return True."""
        if self.max_tools <= 0:
            return False
        skills = self.build(await self.agent.agents())
        digest = contracts_digest([s.mcp() for s in skills.values()])
        changed = digest != self._digest
        self.skills, self._digest = skills, digest
        if changed:
            for listener in list(self.listeners):
                try:
                    listener()
                except Exception:
                    log.exception("a skills listener raised")
        return changed

    def tools(self) -> list[dict[str, Any]]:
        return [s.mcp() for s in self.skills.values()]

    async def watch(self, every: float = 1.0) -> None:
        """Refresh every ``every`` seconds (the listeners hear of changes), until cancelled."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.refresh()
            except MeshError as exc:
                log.debug("skills refresh failed: %s", exc)
