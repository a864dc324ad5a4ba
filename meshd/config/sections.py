"""The config file's own sections: ``[tasks]``, ``[spawn]`` (with ``[[spawn.templates]]``) and
``[tools]``, each a pydantic model that :class:`meshd.config.Settings` holds as one field.

Owns: the keys, defaults, bounds and checks of those sections. Must not touch: loading (file,
environment, flags) and the flat daemon settings, which stay in :mod:`meshd.config`; the parts that
read these settings (meshd/tasks/, meshd/tools/spawn.py, meshd/tools/).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ApprovalPolicy", "SpawnSettings", "SpawnTemplate", "TaskSettings", "ToolsSettings"]


# -- [tasks] and [spawn] sections ------------------------------------------------------------------


class TaskSettings(BaseModel):
    """``[tasks]``: the task store, the scheduler and plans (meshd/tasks/)."""

    model_config = ConfigDict(extra="forbid")

    max_plan_tasks: int = Field(
        default=256, ge=1, le=100_000,
        description="Most tasks one create_plan may hold (one round); a bigger plan is refused.")
    max_rounds: int = Field(
        default=5, ge=1, le=100, description="Most re-plan rounds a plan may ask for (create_plan rounds).")
    max_attempts: int = Field(
        default=3, ge=1, le=100,
        description="Dispatches of one task (each to another agent where one exists) before it fails.")
    dispatch_timeout: float = Field(
        default=30.0, gt=0, description="Seconds one dispatch (a request to the agent) may take.")
    default_deadline: float = Field(
        default=3600.0, gt=0,
        description="Seconds a task may take in all, waiting for a capable agent included, unless "
        "the caller gives a deadline.")
    resume_grace: float = Field(
        default=15.0, gt=0,
        description="After a restart, seconds a running task waits for its assignee to be online "
        "again (to be re-asked with the same attempt) before it is retried elsewhere.")
    max_stored_tasks: int = Field(
        default=10_000, ge=10,
        description="Tasks kept in the store; finished ones are pruned oldest first, and when "
        "only unfinished ones remain, creating more fails with TASK_STORE_FULL.")
    fsync: bool = Field(
        default=True,
        description="Commit the task store with fsync (SQLite synchronous=FULL, like the qos-1 "
        "outbox). false: synchronous=NORMAL, which survives a kill -9 of the daemon but not a "
        "power cut, and dispatches faster.")
    directory_refresh: float = Field(
        default=0.25, gt=0, le=10,
        description="Seconds between the scheduler's looks at the agent directory while a task waits.")


class SpawnTemplate(BaseModel):
    """One ``[[spawn.templates]]`` entry: an agent command the daemon may start and supervise."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Template name spawn_agent uses.")
    command: list[str] = Field(min_length=1, description="argv of the agent process (no shell).")
    capabilities: list[str] = Field(default_factory=list,
                                    description="Capabilities the child is told to register.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    cwd: Path | None = Field(default=None, description="Working directory (default: the state dir).")
    max_instances: int = Field(default=1, ge=1, le=1000, description="Children of this template at once.")
    restart: Literal["never", "on-failure", "always"] = Field(
        default="never", description="Restart the child when it exits: never, on-failure, always.")


class SpawnSettings(BaseModel):
    """``[spawn]``: supervised agent children started by spawn_agent (meshd/tools/spawn.py)."""

    model_config = ConfigDict(extra="forbid")

    max_children: int = Field(default=16, ge=0, le=1000,
                              description="Children of all templates at once.")
    stop_timeout: float = Field(default=5.0, gt=0,
                                description="Seconds a child gets after SIGTERM before SIGKILL.")
    log_line_bytes: int = Field(default=2000, ge=80, le=65536,
                                description="Longest child output line logged (longer ones are cut).")
    max_restarts: int = Field(default=10, ge=0,
                              description="Restarts of one child before it is given up on.")
    templates: list[SpawnTemplate] = Field(default_factory=list,
                                           description="The agent templates spawn_agent may start.")

    @field_validator("templates")
    @classmethod
    def _unique_names(cls, value: list[SpawnTemplate]) -> list[SpawnTemplate]:
        seen: set[str] = set()
        for template in value:
            if template.name in seen:
                raise ValueError(f"template name {template.name!r} is used twice")
            seen.add(template.name)
        return value


# -- [tools] section -------------------------------------------------------------------------------

ApprovalPolicy = Literal["allow", "deny", "hold"]


class ToolsSettings(BaseModel):
    """``[tools]``: syscall tools (meshd/tools/): approval policy, quotas per agent, bounds."""

    model_config = ConfigDict(extra="forbid")

    default_approval: ApprovalPolicy = Field(
        default="allow",
        description="Policy for a tool with side effects that `approval` does not name: allow, deny "
        "or hold (wait for a person: meshctl approvals allow|deny ID).")
    approval: dict[str, ApprovalPolicy] = Field(
        default_factory=dict,
        description="Policy per tool name, e.g. {spawn_agent = \"hold\"}; wins over default_approval.")
    approval_timeout: float = Field(
        default=120.0, gt=0,
        description="Seconds a held call waits for a person before it is denied (the caller's own "
        "deadline may end it sooner).")
    max_held: int = Field(default=100, ge=1, le=100_000,
                          description="Held calls at once; one more is refused with QUEUE_FULL.")
    calls_per_minute: int = Field(default=600, ge=1,
                                  description="Tool calls one agent may make in any 60 s window.")
    max_concurrent_tasks: int = Field(
        default=100, ge=1, description="Unfinished tasks (create_task, create_plan) one agent may own.")
    max_spawned: int = Field(default=4, ge=0,
                             description="Live agents one agent may have started with spawn_agent.")
    max_pending_asks: int = Field(
        default=1000, ge=1,
        description="ask_agent questions waiting for their answer at once; one more is refused "
        "with QUEUE_FULL.")
    max_wait: float = Field(
        default=300.0, gt=0,
        description="Longest wait a tool call may ask for (request_agent, wait_task timeouts).")

    @field_validator("approval")
    @classmethod
    def _tool_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
                raise ValueError(f"{name!r} is not a tool name")
        return value
