"""Daemon settings: a pydantic model plus the loader that layers its sources.

Precedence, highest first: command-line flags > ``MESHD_*`` environment variables > the TOML file >
built-in defaults. The TOML file has flat top-level keys named like the fields below (see
``conf/meshd.toml`` for a commented example of every setting), plus one ``[plugins.NAME]`` table
per plugin: those sections are kept raw in :attr:`Settings.plugin_sections` and validated by the
plugin host against each plugin's own model (meshd.plugins.config). With sections, the module list
is written ``[plugins] modules = [...]`` (TOML cannot hold ``plugins = [...]`` beside them).
An environment variable is ``MESHD_`` + the field name in upper case (``MESHD_PUB_PORT``); list
settings are comma-separated there and booleans accept 1/0/true/false/yes/no/on/off. Any bad value raises
:class:`meshd.errors.ConfigError` naming the key and where the value came from.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from socket import gethostname
from typing import Any, Literal, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from meshd.config.sections import (
    A2aSettings,
    SpawnSettings,
    SpawnTemplate,
    TaskSettings,
    ToolsSettings,
)
from meshd.errors import ConfigError
from meshd.util.paths import (
    SYSTEMD_SOCKET,
    _env_dir,
    default_runtime_dir,
    default_socket_path,
    find_agent_socket,
)
from meshd.util.statefiles import make_dir

__all__ = [
    "ENV_PREFIX",
    "SYSTEMD_SOCKET",
    "Settings",
    "SpawnSettings",
    "SpawnTemplate",
    "TaskSettings",
    "ToolsSettings",
    "default_runtime_dir",
    "default_socket_path",
    "default_state_dir",
    "ensure_dirs",
    "find_agent_socket",
    "load_settings",
]

ENV_PREFIX = "MESHD_"

# Longest path a Linux AF_UNIX socket address can hold (sun_path is 108 bytes with the NUL).
_MAX_SOCKET_PATH = 107

_MESH_RE = re.compile(r"[A-Za-z0-9_-]{1,63}")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$STATE_DIRECTORY`` (systemd), else ``$XDG_STATE_HOME/meshd``, else ``~/.local/state/meshd``."""
    env = os.environ if environ is None else environ
    state = _env_dir(env, "STATE_DIRECTORY")
    if state is not None:
        return state
    xdg = _env_dir(env, "XDG_STATE_HOME")
    if xdg is not None:
        return xdg / "meshd"
    home = _env_dir(env, "HOME") or Path.home()
    return home / ".local" / "state" / "meshd"


class Settings(BaseModel):
    """Every setting of the meshd daemon, validated."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    # identity
    name: str = Field(
        default_factory=gethostname,
        description="Human-readable node name shown to peers and in meshctl (default: the host name).",
    )
    mesh: str = Field(
        default="default",
        description="Mesh name (1-63 of A-Z a-z 0-9 _ -); daemons of other meshes on the LAN are ignored.",
    )
    # network
    interfaces: list[str] = Field(
        default_factory=list,
        description="IPv4 addresses that mDNS and the mesh bind and advertise on; empty = every up, "
        "multicast-capable interface except loopback, docker*, veth* and br-*.",
    )
    port: int = Field(default=0, ge=0, le=65535, description="Mesh ROUTER TCP port; 0 = any free port.")
    pub_port: int = Field(default=0, ge=0, le=65535, description="Topic XPUB TCP port; 0 = any free port.")
    peers: list[str] = Field(
        default_factory=list,
        description='Static peers "tcp://HOST:PORT" for networks without multicast (VPN, routed '
        "subnets); one seed is enough, the rest are learned by gossip. In trust_mode keys, add the "
        "peer's public key: tcp://HOST:PORT?key=HEX (meshctl keys show prints it).",
    )
    # discovery
    discovery: bool = Field(default=True, description="Discover and announce peers with mDNS (zeroconf).")
    # security
    insecure: bool = Field(default=False, description="Run the mesh in plaintext, without CurveZMQ.")
    allow_insecure_lan: bool = Field(
        default=False,
        description="Allow insecure mode on non-loopback interfaces, static peers and discovered or "
        "gossiped endpoints (otherwise it is loopback-only).",
    )
    trust_mode: Literal["keys", "secret"] = Field(
        default="keys",
        description="keys: trust the public keys in authorized_keys_dir (one file per node); "
        "secret: every node derives the mesh keypair from mesh_secret_file.",
    )
    authorized_keys_dir: Path | None = Field(
        default=None,
        description="Folder of trusted node public keys (keys mode); unset = <state_dir>/authorized_keys. "
        "Changes apply without a restart.",
    )
    mesh_secret_file: Path | None = Field(
        default=None,
        validate_default=True,  # so trust_mode = "secret" without a file is caught
        description="File holding the shared mesh secret (secret mode; mode 0600, at least 16 bytes).",
    )
    # paths
    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="Persistent state (keys, dead letters): $STATE_DIRECTORY (systemd), else "
        "$XDG_STATE_HOME/meshd, else ~/.local/state/meshd.",
    )
    socket: Path | None = Field(
        default=None,
        description="Local agent socket path; unset = <runtime dir>/meshd.sock, where the runtime dir is "
        "$RUNTIME_DIRECTORY, else $XDG_RUNTIME_DIR/meshd, else /tmp/meshd-<uid>.",
    )
    # liveness
    heartbeat_interval: float = Field(default=1.0, gt=0, description="Seconds between heartbeats.")
    stale_after: float = Field(
        default=3.0,
        gt=0,
        validate_default=True,  # so the cross-field check sees defaults too
        description="Seconds without a heartbeat before a peer or agent is stale (> heartbeat_interval).",
    )
    offline_after: float = Field(
        default=10.0,
        gt=0,
        validate_default=True,  # so the cross-field check sees defaults too
        description="Seconds without a heartbeat before a peer or agent is offline (> stale_after).",
    )
    address_poll_interval: float = Field(
        default=2.0, ge=0,
        description="Seconds between checks of this host's interface addresses (0 = never): a "
        "gained, lost or changed address re-binds, re-advertises and re-greets peers.",
    )
    discovery_requery_max: float = Field(
        default=60.0, ge=1.0, le=3600.0,
        description="Longest pause, in seconds, between the mDNS queries of a node that has fewer "
        "peers than it heard of (a node with no peer at all asks at least every 10 s): discovery "
        "never gives up on a node that missed its first seconds on the LAN.",
    )
    alone_warning_after: float = Field(
        default=30.0, ge=0,
        description="Seconds without any peer before the daemon logs, once, what discovery heard "
        "(0 = never).",
    )
    # limits
    discovered_records_max: int = Field(
        default=256, ge=1,
        description="Nodes kept per table of nodes discovered but not peers (untrusted key, other "
        "mesh, other protocol version) and of duplicate node ids (oldest forgotten first).",
    )
    max_payload_bytes: int = Field(
        default=1048576,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Largest message payload accepted, in bytes (1 KiB .. 64 MiB).",
    )
    inbox_cap: int = Field(
        default=100, ge=1, description="Messages queued per agent inbox before senders get INBOX_FULL."
    )
    hop_limit: int = Field(
        default=5, ge=1, le=64, description="How many times a message may be forwarded (1..64)."
    )
    max_open_requests: int = Field(
        default=100_000, ge=16,
        description="Requests delivered to local agents and not answered yet that the daemon keeps "
        "to check answers against (a reply, error or progress to anyone else is refused); past it "
        "the oldest is forgotten and a late answer to it is refused.",
    )
    agent_answer_backlog: int = Field(
        default=1000, ge=16, le=100_000,
        description="Daemon answers and error notices kept per agent connection while its inbox is "
        "full (they never share the data inbox cap); a client with at most this many calls in flight "
        "gets every answer. The register answer tells it as in_flight_max.",
    )
    priority_hold_max: int = Field(
        default=256, ge=0, le=100_000,
        description="Urgent (priority 0-4) qos-0 messages kept per agent connection while its inbox "
        "is full, sent ahead of other data as it reads (lowest priority number first); past it they "
        "are refused with INBOX_FULL like any other. 0: none kept.",
    )
    agent_credit_max: int = Field(
        default=32, ge=0, le=10_000,
        description="Credit mode on the agent link (docs/PROTOCOL.md, credit): the most data messages "
        "the daemon writes into a crediting agent's pipe beyond what it said it has read; the rest "
        "waits in the daemon's memory (inbox_cap per connection, then INBOX_FULL) in priority order, "
        "so an urgent message is at most this many behind. 0: credit mode off (today's pipe).",
    )
    route_memory: int = Field(
        default=10_000, ge=16, le=1_000_000,
        description="Requests sent to a route: address (content routing) whose chosen agent is "
        "remembered, so a cancel follows its request; past it the oldest is forgotten (its cancel is "
        "then dropped, counted as route_cancel_unknown).",
    )
    publisher_notices_max: int = Field(
        default=1024, ge=1, le=1_000_000,
        description="Publishers remembered for the rate limit of the INBOX_FULL notice a full "
        "subscriber inbox sends them (at most one per 0.1 s each); past it the oldest is forgotten "
        "(and may hear one notice more).",
    )
    publish_hold_max: int = Field(
        default=2048, ge=0, le=1_000_000,
        description="Publications a subscriber's daemon holds for it while its inbox is full (its "
        "publishers are asked to pause); past it they are dropped with a gap notice. 0: no hold.")
    publish_hold_max_bytes: int = Field(
        default=16 * 1024 * 1024, ge=0, description="Bytes of held publications, all subscribers together.")
    max_subscriptions_per_agent: int = Field(
        default=256, ge=1, le=10_000,
        description="Topics one agent may subscribe to; more are refused with TOO_LARGE.",
    )
    max_patterns_per_agent: int = Field(
        default=32, ge=0, le=1_000,
        description="Wildcard patterns (`*`, `>`) among one agent's subscriptions; more are refused "
        "with TOO_LARGE (each publication is matched against every pattern of the node). 0: none.",
    )
    max_pattern_tokens: int = Field(
        default=16, ge=1, le=128,
        description="Dot-separated tokens in one wildcard pattern; longer patterns are refused with "
        "TOO_LARGE.",
    )
    agent_metadata_max_bytes: int = Field(
        default=8 * 1024, ge=256, le=64 * 1024,
        description="Largest capabilities plus metadata of one agent (msgpack bytes); larger "
        "registrations are refused with TOO_LARGE.",
    )
    contracts_max_bytes: int = Field(
        default=64 * 1024, ge=0, le=256 * 1024,
        description="Largest set of contract records (typed topics with their JSON Schemas) one "
        "agent may advertise, msgpack bytes; a registration past it is refused with TOO_LARGE. "
        "0: no agent may advertise contracts.",
    )
    directory_max_bytes: int = Field(
        default=512 * 1024, ge=16 * 1024, le=768 * 1024,
        description="Largest directory this node sends its peers (all its agents' records, msgpack "
        "bytes); a registration or subscription past it is refused with TOO_LARGE, so no legal "
        "input makes a directory peers cannot take.",
    )
    # delivery
    qos1_attempts: int = Field(
        default=3, ge=1, le=100,
        description="Deliveries of a qos-1 message that go unacknowledged before it becomes a dead letter.",
    )
    qos1_ack_timeout: float = Field(
        default=5.0, gt=0,
        description="Seconds to wait for a qos-1 ack (the handler finished) before trying again; "
        "doubles after each attempt.",
    )
    qos1_ttl: float = Field(
        default=3600.0, gt=0,
        description="Seconds a qos-1 message may wait in the outbox (receiver absent, inbox full, "
        "peer unreachable) before it becomes a dead letter.",
    )
    qos1_outbox_max: int = Field(
        default=20_000, ge=1,
        description="qos-1 units (a single message or a batch) the outbox holds in total before "
        "senders get OUTBOX_FULL.",
    )
    qos1_outbox_max_bytes: int = Field(
        default=128 * 1024 * 1024, ge=1024 * 1024,
        description="Bytes the qos-1 outbox holds in total (frames plus a per-unit overhead) before "
        "senders get OUTBOX_FULL.",
    )
    qos1_outbox_per_dest_max: int = Field(
        default=5_000, ge=1,
        description="qos-1 units the outbox holds for one destination before its senders get "
        "OUTBOX_FULL.",
    )
    qos1_outbox_per_dest_max_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024 * 1024,
        description="Bytes the qos-1 outbox holds for one destination before its senders get "
        "OUTBOX_FULL.",
    )
    dead_letter_capacity: int = Field(
        default=1024, ge=1, description="Dead letters kept in memory (oldest evicted first)."
    )
    dead_letter_jsonl: bool = Field(
        default=False,
        description="Also append every dead letter to <state_dir>/deadletters.jsonl (built-in sink).",
    )
    # logging
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level: debug, info, warning or error."
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="Log format: text (human) or json (one object per line)."
    )
    metrics_topic_labels: int = Field(
        default=100, ge=1, le=10_000,
        description="Distinct topics named in the per-topic message counts (metrics); the rest "
        "are counted under 'other', so agents' topic names cannot grow the label set.",
    )
    # tracing (docs/tracing.md)
    otlp_endpoint: str | None = Field(
        default=None, max_length=2048,
        description="Export the daemon's own OpenTelemetry spans (its gateway, tools and task "
        "dispatch calls) over OTLP/HTTP to this URL (http://host:4318, or a full .../v1/traces); "
        "needs the otel-export extra. Off by default.",
    )
    # HTTP/SSE gateway (docs/http.md)
    http: bool = Field(default=True, description="Serve the HTTP/SSE gateway and the web dashboard.")
    http_host: str = Field(
        default="127.0.0.1",
        description="Address the gateway listens on; a non-loopback address needs http_tls_cert and "
        "http_tls_key unless allow_plain_http_lan is set.",
    )
    http_port: int = Field(default=0, ge=0, le=65535, description="Gateway TCP port; 0 = any free port.")
    http_tls_cert: Path | None = Field(
        default=None, description="PEM certificate for HTTPS (with http_tls_key)."
    )
    http_tls_key: Path | None = Field(
        default=None, validate_default=True,  # so a cert without a key is caught
        description="PEM private key for HTTPS (with http_tls_cert).",
    )
    allow_plain_http_lan: bool = Field(
        default=False,
        description="Allow plain HTTP on a non-loopback http_host (the token travels in clear).",
    )
    http_token_group_readable: bool = Field(
        default=False, description="Write http.token mode 0640 (group readable) instead of 0600."
    )
    http_max_sessions: int = Field(default=256, ge=1, description="HTTP agents registered at once.")
    http_max_streams: int = Field(
        default=64, ge=1, description="Open SSE streams at once (agents and dashboards); past it, 429."
    )
    http_sse_buffer: int = Field(
        default=1024, ge=16,
        description="Events kept per stream for Last-Event-ID resumption; older ones are reported as a gap.",
    )
    http_max_body_bytes: int = Field(
        default=1048576, ge=1024, description="Largest request body accepted, in bytes; past it, 413."
    )
    http_check_responses: bool = Field(
        default=False,
        description="For tests: check every gateway response against its model in the OpenAPI document; "
        "a mismatch is answered 500 RESPONSE_INVALID and logged.",
    )
    # plugins
    plugins: list[str] = Field(
        default_factory=list,
        description="Extra plugin modules to load, by import name (installed entry points load anyway).",
    )
    plugin_queue_size: int = Field(
        default=10_000, ge=1,
        description="Observer events queued per plugin before its events are dropped (and counted).",
    )
    # [plugins.NAME] sections, raw: the plugin host validates them against each plugin's model.
    _plugin_sections: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)

    @property
    def plugin_sections(self) -> dict[str, dict[str, Any]]:
        """Each ``[plugins.NAME]`` table of the config file, by plugin name, as written."""
        return self._plugin_sections
    # [tasks] and [spawn] sections
    tasks: TaskSettings = Field(default_factory=TaskSettings,
                                description="[tasks]: task store, scheduler and plans.")
    spawn: SpawnSettings = Field(default_factory=SpawnSettings,
                                 description="[spawn]: supervised agent children (spawn_agent).")
    # [tools] section
    tools: ToolsSettings = Field(default_factory=ToolsSettings,
                                 description="[tools]: syscall tools: approval, quotas per agent.")
    # [a2a] section: read by `meshd a2a` (its own process), only validated by the daemon
    a2a: A2aSettings = Field(default_factory=A2aSettings,
                             description="[a2a]: the A2A binding (meshd a2a): exposure, tasks, remotes.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be empty")
        if len(value) > 255:
            raise ValueError("must be at most 255 characters")
        if "@" in value:
            raise ValueError("must not contain '@' (used in name@node addresses)")
        if any(not ch.isprintable() for ch in value):
            raise ValueError("must not contain control characters")
        return value

    @field_validator("mesh")
    @classmethod
    def _check_mesh(cls, value: str) -> str:
        if not _MESH_RE.fullmatch(value):
            raise ValueError("must be 1-63 characters of A-Z a-z 0-9 _ -")
        return value

    @field_validator("interfaces")
    @classmethod
    def _check_interfaces(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for item in value:
            try:
                addr = ipaddress.IPv4Address(item.strip())
            except ValueError:
                raise ValueError(f"{item!r} is not an IPv4 address")
            if str(addr) not in out:
                out.append(str(addr))
        return out

    @field_validator("peers")
    @classmethod
    def _check_peers(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for item in value:
            item = item.strip()
            problem = f"{item!r} is not tcp://HOST:PORT"
            try:
                parts = urlsplit(item)
                port = parts.port
            except ValueError:
                raise ValueError(f"{problem} (bad port)")
            if parts.scheme != "tcp":
                raise ValueError(f"{problem} (scheme must be tcp)")
            if not parts.hostname or any(ch.isspace() for ch in parts.hostname):
                raise ValueError(f"{problem} (missing host)")
            if port is None or not 1 <= port <= 65535:
                raise ValueError(f"{problem} (port must be 1..65535)")
            if parts.query and not re.fullmatch(r"key=[0-9a-fA-F]{64}", parts.query):
                raise ValueError(f"{problem}[?key=<64 hex digits of the peer's public key>] (bad query)")
            if parts.username or parts.password or parts.path or parts.fragment:
                raise ValueError(f"{problem} (unexpected user, path or fragment)")
            if item not in out:
                out.append(item)
        return out

    @field_validator("state_dir")
    @classmethod
    def _check_state_dir(cls, value: Path) -> Path:
        if not str(value):
            raise ValueError("must not be empty")
        return value.expanduser()

    @field_validator("socket")
    @classmethod
    def _check_socket(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        value = value.expanduser()
        if len(os.fsencode(value)) > _MAX_SOCKET_PATH:
            raise ValueError(f"path is longer than {_MAX_SOCKET_PATH} bytes, too long for a Unix socket")
        return value

    @field_validator("stale_after")
    @classmethod
    def _check_stale_after(cls, value: float, info: ValidationInfo) -> float:
        beat = info.data.get("heartbeat_interval")
        if beat is not None and not value > beat:
            raise ValueError(f"must be greater than heartbeat_interval ({beat})")
        return value

    @field_validator("mesh_secret_file")
    @classmethod
    def _check_secret_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None and info.data.get("trust_mode") == "secret" and not info.data.get("insecure"):
            raise ValueError("trust_mode = 'secret' needs mesh_secret_file")
        return value.expanduser() if value is not None else None

    @field_validator("offline_after")
    @classmethod
    def _check_offline_after(cls, value: float, info: ValidationInfo) -> float:
        stale = info.data.get("stale_after")
        if stale is not None and not value > stale:
            raise ValueError(f"must be greater than stale_after ({stale})")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _check_otlp(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL (an OTLP/HTTP receiver)")
        return value.strip()

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("plugins")
    @classmethod
    def _check_plugins(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for item in value:
            item = item.strip()
            if not _MODULE_RE.fullmatch(item):
                raise ValueError(f"{item!r} is not a module import name")
            if item not in out:
                out.append(item)
        return out

    @field_validator("http_host")
    @classmethod
    def _check_http_host(cls, value: str) -> str:
        value = value.strip()
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if value != "localhost":
                raise ValueError(f"{value!r} is not an IP address")
        return value

    @field_validator("http_tls_key")
    @classmethod
    def _check_http_tls(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        cert = info.data.get("http_tls_cert")
        if (value is None) != (cert is None):
            raise ValueError("http_tls_cert and http_tls_key go together")
        return value.expanduser() if value is not None else None

    def resolved_authorized_keys(self) -> Path:
        """The authorized-keys folder: the setting, or <state_dir>/authorized_keys."""
        return self.authorized_keys_dir or self.state_dir / "authorized_keys"

    def resolved_socket(self) -> Path:
        """The agent socket path: ``socket`` if set, else :func:`default_socket_path`."""
        return self.socket if self.socket is not None else default_socket_path()


_FIELDS = tuple(Settings.model_fields)
_LIST_FIELDS = frozenset(n for n, f in Settings.model_fields.items() if get_origin(f.annotation) is list)
_BOOL_FIELDS = frozenset(n for n, f in Settings.model_fields.items() if f.annotation is bool)


def _unknown_key(key: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, _FIELDS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(key, f"unknown setting (in {where}){hint}")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("config", f"config file not found: {path}")
    except tomllib.TOMLDecodeError as exc:
        # The message ends with "(at line N, column M)".
        raise ConfigError("config", f"{path}: invalid TOML: {exc}")
    except UnicodeDecodeError as exc:
        raise ConfigError("config", f"{path}: not valid UTF-8: {exc}")
    except OSError as exc:
        raise ConfigError("config", f"cannot read config file {path}: {exc.strerror or exc}")


def _split_plugins_table(table: dict[str, Any], path: Path) -> tuple[Any, dict[str, dict[str, Any]]]:
    """``[plugins]`` as a table: its ``modules`` list (or None) and its ``[plugins.NAME]`` sections."""
    sections: dict[str, dict[str, Any]] = {}
    for name, section in table.items():
        if name == "modules":
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"plugins.{name}", f"expected a [plugins.{name}] table, or the module list "
                              f"as plugins.modules (in {path})")
        sections[name] = section
    return table.get("modules"), sections


def _from_env(key: str, var: str, raw: str) -> Any:
    if key in _LIST_FIELDS:
        return [item.strip() for item in raw.split(",") if item.strip()]
    if key in _BOOL_FIELDS:
        word = raw.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ConfigError(key, f"expected one of 1/0/true/false/yes/no/on/off (from {var}={raw!r})")
    if key == "socket" and not raw.strip():
        return None
    return raw.strip()


def load_settings(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings from defaults, the TOML file, ``MESHD_*`` variables and CLI ``overrides``.

    ``overrides`` holds already-typed flag values keyed by field name; ``None`` values are ignored.
    Raises :class:`ConfigError` naming the offending key and the source of its value.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    sections: dict[str, dict[str, Any]] = {}
    if config_file is not None:
        data = _read_file(config_file)
        if isinstance(data.get("plugins"), dict):
            data["plugins"], sections = _split_plugins_table(data["plugins"], config_file)
            if data["plugins"] is None:
                del data["plugins"]
        for key, value in data.items():
            if key not in Settings.model_fields:
                raise _unknown_key(key, str(config_file))
            values[key] = value
            sources[key] = f"{config_file}: {key} = {value!r}"

    for key in _FIELDS:
        var = ENV_PREFIX + key.upper()
        raw = env.get(var)
        if raw is None:
            continue
        values[key] = _from_env(key, var, raw)
        sources[key] = f"{var}={raw!r}"

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in Settings.model_fields:
            raise _unknown_key(key, "command-line overrides")
        values[key] = value
        sources[key] = f"flag --{key.replace('_', '-')}={value!r}"

    if "state_dir" not in values:
        values["state_dir"] = default_state_dir(env)

    try:
        settings = Settings.model_validate(values)
        settings._plugin_sections = sections
        return settings
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = err.get("loc", ())
        key = ".".join(str(part) for part in loc) or "settings"
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        source = sources.get(str(loc[0])) if loc else None
        raise ConfigError(key, f"{msg} ({f'from {source}' if source else 'default value'})")


def ensure_dirs(settings: Settings) -> None:
    """Create the state dir (0700) and the agent socket's directory (0750) if they are missing,
    and refuse ones another user owns (meshd/util/statefiles.py)."""
    make_dir(settings.state_dir, 0o700, "state_dir")
    make_dir(settings.resolved_socket().parent, 0o750, "socket")
