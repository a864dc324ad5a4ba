"""An example meshd tool plugin: two LLM-callable tools, contributed through ``meshd_tools``.

* ``pick_agent`` (no side effects): the least-loaded online agent with a capability, from the
  live telemetry every daemon already has.
* ``leave_note`` (side effects, so it passes through the daemon's approval policy): send a short
  note to an agent, on topic ``note``, marked with the calling agent's name.

A tool is a name, a description, a pydantic model for its arguments (its JSON Schema is what an
LLM sees; calls are validated against it before the handler runs) and an async handler that gets
the validated arguments and a ``meshd.tools.ToolContext`` (``ctx.caller``, ``ctx.agent``: the
daemon's system agent, ``ctx.settings``). Raise a ``meshd.errors.MeshError`` subclass for a typed
failure; anything else reaches the caller as HANDLER_ERROR.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from meshd.errors import NoSuchAgent
from meshd.hookspecs import hookimpl
from meshd.tools import Tool, ToolContext


class PickAgentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    capability: str = Field(description="The capability the agent must have.", min_length=1)


class LeaveNoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str = Field(description="Who gets the note.", min_length=1)
    text: str = Field(description="The note (at most 500 characters).", min_length=1, max_length=500)


def _load(record: dict[str, Any]) -> tuple[float, float]:
    telemetry = record.get("telemetry") or {}
    return (float(telemetry.get("queue_depth") or 0), float(telemetry.get("context_used_pct") or 0))


async def pick_agent(args: PickAgentArgs, ctx: ToolContext) -> dict[str, Any]:
    capable = [a for a in await ctx.agent.agents()
               if a.get("state") == "online" and args.capability in (a.get("capabilities") or [])]
    if not capable:
        raise NoSuchAgent(f"no online agent has capability {args.capability!r}")
    best = min(capable, key=_load)
    queue, context = _load(best)
    return {"agent": best["name"], "node": best.get("node_name"), "queue_depth": queue,
            "context_used_pct": context, "candidates": len(capable)}


async def leave_note(args: LeaveNoteArgs, ctx: ToolContext) -> dict[str, Any]:
    msg_id = await ctx.agent.send(args.agent, "note", {"text": args.text, "from": ctx.caller},
                                  headers={"meshd-caller": ctx.caller})
    return {"sent": True, "message_id": msg_id}


@hookimpl
def meshd_tools() -> list[Tool]:
    return [
        Tool("pick_agent", "The least-loaded online agent with a capability (by queue depth, then "
             "context use).", PickAgentArgs, pick_agent),
        Tool("leave_note", "Leave a short note for an agent (topic 'note').", LeaveNoteArgs, leave_note,
             side_effects=True),
    ]
