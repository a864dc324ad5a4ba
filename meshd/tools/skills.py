"""The mesh's typed skills as tools: one per agent, typed topic and major version, from the directory.

Owns :func:`build_skills` (agent records with contract records in, :class:`Skill` out: the tool
name ``agent__topic``, with ``__v<major>`` for an older major served beside a newer one; names
of ``[A-Za-z0-9_-]``, at most 64 characters, as every LLM API takes them; the contract's
``accepts`` schema as the input schema, wrapped as ``{"payload": ...}`` when it is not an
object; bounded and filtered) and :func:`skill_schema` (a skill in the shape OpenAI, Anthropic or
MCP takes). Pure: no sockets, no pydantic. ``meshd mcp`` lists them as tools
(meshd/bindings/mcp_skills.py) and ``meshctl tools schema --skills`` exports them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from meshd.wire.contracts import parse_version

__all__ = ["PAYLOAD_KEY", "SKILL_SEPARATOR", "Skill", "build_skills", "skill_schema"]

SKILL_SEPARATOR: Final = "__"
PAYLOAD_KEY: Final = "payload"
MAX_TOOL_NAME: Final = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class Skill:
    """One typed topic of one agent, as a tool."""

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


def skill_schema(skill: Skill, fmt: str) -> dict[str, Any]:
    """``skill`` in the shape ``fmt`` (``openai``, ``anthropic`` or ``mcp``) takes."""
    if fmt == "openai":
        return {"type": "function", "function": {"name": skill.tool, "description": skill.description,
                                                 "parameters": skill.input_schema}}
    if fmt == "anthropic":
        return {"name": skill.tool, "description": skill.description, "input_schema": skill.input_schema}
    return skill.mcp()


def _input_schema(accepts: Any) -> tuple[dict[str, Any], bool]:
    if isinstance(accepts, dict) and accepts.get("type") == "object":
        return accepts, False
    inner = accepts if isinstance(accepts, dict) else {}
    return {"type": "object", "properties": {PAYLOAD_KEY: inner}, "required": [PAYLOAD_KEY]}, True


def build_skills(records: Iterable[dict[str, Any]], *, exclude: str = "", max_tools: int = 64,
                 allow: tuple[str, ...] = ()) -> tuple[dict[str, Skill], int]:
    """The skills of these agent records (not ``exclude``'s own), at most ``max_tools`` of them,
    only those whose tool or agent name matches a shell pattern of ``allow`` (empty: all).
    Returns them by tool name, and how many were left out by the bound."""
    skills: dict[str, Skill] = {}
    left_out = 0
    for rec in sorted(records, key=lambda r: str(r.get("name"))):
        name = rec.get("name")
        contracts = rec.get("contracts")
        if not isinstance(name, str) or name == exclude or not isinstance(contracts, list):
            continue
        versions = [(c, v) for c in contracts if isinstance(c, dict) and isinstance(c.get("topic"), str)
                    and (v := parse_version(c.get("version"))) is not None]
        newest: dict[str, int] = {}
        for c, v in versions:
            newest[c["topic"]] = max(newest.get(c["topic"], -1), v[0])
        for c, v in versions:
            topic = str(c["topic"])
            tool = _UNSAFE.sub("_", f"{name}{SKILL_SEPARATOR}{topic}")
            if v[0] != newest[topic]:
                tool += f"{SKILL_SEPARATOR}v{v[0]}"
            tool = tool[:MAX_TOOL_NAME]
            if tool in skills or (allow and not any(fnmatch.fnmatchcase(tool, p) or
                                                    fnmatch.fnmatchcase(name, p) for p in allow)):
                continue
            if len(skills) >= max_tools:
                left_out += 1
                continue
            schema, wrapped = _input_schema(c.get("accepts"))
            text = str(c.get("description") or f"{topic} of agent {name}")
            skills[tool] = Skill(tool, name, topic, str(c["version"]),
                                 f"{text} (skill {topic!r} v{c['version']} of mesh agent {name!r}; "
                                 "a request to it)", schema, wrapped)
    return skills, left_out
