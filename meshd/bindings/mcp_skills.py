"""Skills as MCP tools: each typed topic of the mesh as a tool of its own, kept fresh.

Owns :class:`SkillTools`: the skills (meshd/tools/skills.py builds them from the directory's
contract records: ``researcher__verify``, the contract's ``accepts`` schema as the input schema)
that ``meshd mcp`` lists, bounded (``max_tools``) and filtered (``allow``), refreshed from the
directory (:meth:`SkillTools.watch`; its listeners hear of each change, so the server sends
``notifications/tools/list_changed``). Calling one is a request to that agent with the
contract's version. Plain data: no SDK here (meshd/bindings/mcp_server.py speaks MCP).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from meshd.client import Agent
from meshd.errors import MeshError
from meshd.tools.skills import Skill, build_skills
from meshd.wire.contracts import contracts_digest

__all__ = ["Skill", "SkillTools"]

log = logging.getLogger("meshd.mcp")


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

    def build(self, records: list[dict[str, Any]]) -> dict[str, Skill]:
        """The skills of these agent records (meshd/tools/skills.py), within the bound and filter."""
        skills, self.left_out = build_skills(records, exclude=self.agent.name, max_tools=self.max_tools,
                                             allow=self.allow)
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
