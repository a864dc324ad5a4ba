"""The config file's own sections: ``[tasks]``, ``[spawn]`` (with ``[[spawn.templates]]``),
``[tools]`` and ``[a2a]`` (with ``[[a2a.remote_agents]]``), each a pydantic model that
:class:`meshd.config.Settings` holds as one field.

Owns: the keys, defaults, bounds and checks of those sections. Must not touch: loading (file,
environment, flags) and the flat daemon settings, which stay in :mod:`meshd.config`; the parts that
read these settings (meshd/tasks/, meshd/tools/spawn.py, meshd/tools/).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["A2aSettings", "ApprovalPolicy", "RemoteA2aAgent", "SpawnSettings", "SpawnTemplate",
           "TaskSettings", "ToolsSettings"]


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


# -- [a2a] section ---------------------------------------------------------------------------------

_AGENT_PATTERN = re.compile(r"[A-Za-z0-9._~*?\[\]-]{1,128}")
_HOST_RE = re.compile(r"[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


class RemoteA2aAgent(BaseModel):
    """``[[a2a.remote_agents]]``: an external A2A agent that ``meshd a2a`` registers as a mesh agent."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Its Agent Card URL (https://host/.well-known/agent-card.json), on "
                     "a host in a2a.trusted_hosts.")
    name: str | None = Field(default=None, description="Mesh agent name (default: the card's name, "
                             "made a mesh name: letters, digits, . _ - kept, others become -).")
    token_file: Path | None = Field(default=None, description="A bearer token sent to it (a 0600 file), "
                                    "when its card asks for HTTP bearer authentication.")

    @field_validator("url")
    @classmethod
    def _card_url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value

    @field_validator("name")
    @classmethod
    def _mesh_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9._~-]{1,128}", value):
            raise ValueError(f"{value!r}: 1-128 characters of A-Z a-z 0-9 . _ ~ -")
        return value


class A2aSettings(BaseModel):
    """``[a2a]``: ``meshd a2a``, the A2A 1.0 binding (meshd/bindings/a2a/, docs/a2a.md). The daemon
    only validates this section; the ``meshd a2a`` process reads it."""

    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default="127.0.0.1:8768", description="HOST:PORT the A2A server listens on "
                        "(port 0: any free port, written to a2a-NAME.json); not loopback needs TLS.")
    expose: list[str] = Field(default_factory=lambda: ["*"], description="Mesh agents served as A2A "
                              "agents (shell patterns on agent names); [] serves none.")
    default_agent: str | None = Field(default=None, description="A served mesh agent that is also the "
                                      "host's own A2A agent: its card at /.well-known/agent-card.json "
                                      "(no tenant), and calls that name no tenant go to it.")
    tasks_agent: str = Field(default="meshd-tasks", description="A virtual A2A agent: a message to it "
                             "becomes a meshd task (create_task) for the least-loaded agent with the "
                             "capability its metadata names; \"\" serves none.")
    max_tasks: int = Field(default=1000, ge=1, le=1_000_000, description="A2A tasks kept (finished "
                           "ones are forgotten oldest first); one more while all run is refused "
                           "with TASK_STORE_FULL.")
    default_timeout: float = Field(default=30.0, gt=0, le=3600, description="Seconds a mesh request "
                                   "made for an A2A message may take when the client sets no budget.")
    max_timeout: float = Field(default=300.0, gt=0, le=86_400, description="Longest budget a client "
                               "may ask for (metadata timeout_s or the X-Meshd-Timeout header).")
    max_connections: int = Field(default=256, ge=1, le=100_000, description="HTTP connections and "
                                 "streams served at once; one more is answered 503.")
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024,
                                description="Largest HTTP request body accepted (413 past it): a "
                                "1 MiB mesh payload fits, JSON and base64 included.")
    topic: str = Field(default="a2a.message", description="Mesh topic of a request made for an A2A "
                       "message that names none (message metadata \"topic\").")
    through_tools: bool = Field(default=False, description="Send A2A messages through the daemon's "
                                "request_agent tool, so [tools] approval, quotas and authorization "
                                "apply to them (a held call shows as AUTH_REQUIRED); else directly.")
    trusted_hosts: list[str] = Field(default_factory=list, description="Hosts (host or host:port) "
                                     "whose Agent Cards are trusted; a remote agent elsewhere is "
                                     "refused at start.")
    remote_agents: list[RemoteA2aAgent] = Field(default_factory=list, description="External A2A "
                                                "agents registered as mesh agents.")
    card_keys: list[Path] = Field(default_factory=list, description="Public keys (PEM) trusted to sign "
                                  "Agent Cards: a remote card one of them signed is trusted from any "
                                  "host.")
    signing_key: Path | None = Field(default=None, description="Private key (PEM: EC P-256, RSA or "
                                     "Ed25519) that signs the cards this server serves.")
    signing_key_id: str = Field(default="meshd", description="The kid of signing_key in the signatures.")
    lan_discovery: bool = Field(default=False, description="Advertise served agents in DNS-SD "
                                "_a2a._tcp and browse for others (listed discovered-but-not-"
                                "admitted until `meshctl a2a trust NAME`).")
    lan_interfaces: list[str] = Field(default_factory=list, description="IPv4 addresses DNS-SD runs "
                                      "on (default: the listen address; 0.0.0.0 needs this list).")
    lan_max_discovered: int = Field(default=256, ge=1, le=10_000, description="A2A agents kept as "
                                    "discovered; past it the oldest not admitted is forgotten.")

    @field_validator("expose")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _AGENT_PATTERN.fullmatch(item):
                raise ValueError(f"{item!r} is not an agent-name pattern")
        return value

    @field_validator("tasks_agent")
    @classmethod
    def _tasks_agent(cls, value: str) -> str:
        if value and not re.fullmatch(r"[A-Za-z0-9._~-]{1,128}", value):
            raise ValueError(f"{value!r}: \"\" or 1-128 characters of A-Z a-z 0-9 . _ ~ -")
        return value

    @field_validator("lan_interfaces")
    @classmethod
    def _ipv4(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            try:
                ipaddress.IPv4Address(item)
            except ValueError:
                raise ValueError(f"{item!r} is not an IPv4 address") from None
        return value

    @field_validator("trusted_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _HOST_RE.fullmatch(item):
                raise ValueError(f"{item!r} is not a host or host:port")
        return [item.lower() for item in value]
