"""The gateway's request and response bodies as pydantic models: what it accepts and answers.

Owns: one model per request body and per response body (and the error body), the string rules
they share (agent names, topics, session ids), and :func:`parse_body` (a JSON body checked
against its model: a typed :class:`~meshd.gateway.errors.BadRequest` naming the field).
meshd.gateway.openapi builds ``/v1/openapi.json`` from these same models, and the gateway checks
its answers against them when ``http_check_responses`` is on (tests), so the document cannot
drift from what is served.
Must not touch: aiohttp, sessions, the mesh. Imported with the application at the first HTTP
connection (pydantic stays out of an idle daemon).

Conventions: an optional field that may be left out is not nullable unless null means something
(``payload: null`` is a payload); the strings the mesh refuses (names with spaces or ``@``, the
daemons' ``meshd.sys.`` prefix) are refused here by the same patterns the document shows.
Records that come from other daemons (agents, peers, node info) allow extra keys: a newer peer
may add optional fields (docs/PROTOCOL.md, the version policy).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

from annotated_types import Ge, Le
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    model_validator,
)

from meshd.client.gather import GATHER_MAX_TARGETS
from meshd.errors import ValidationFailed
from meshd.gateway.errors import BadRequest
from meshd.wire import protocol as P
from meshd.wire import topics as T

__all__ = [
    "ABSENT_MARK",
    "AGENT_EVENTS",
    "DASHBOARD_EVENTS",
    "MAX_TIMEOUT_S",
    "AgentRecord",
    "AgentsList",
    "DeadLetter",
    "DeadLettersList",
    "DelegateRequest",
    "ErrorBody",
    "GapEvent",
    "GatherRequest",
    "GatherResult",
    "HandoffRequest",
    "HandoffResult",
    "HeartbeatRequest",
    "HeartbeatResult",
    "MessageAccepted",
    "MessageEvent",
    "MessageRequest",
    "NodeInfo",
    "OkResult",
    "PeerRecord",
    "PeersList",
    "PublishRequest",
    "PublishResult",
    "RegisterRequest",
    "RegisterResult",
    "RequestRequest",
    "RequestResult",
    "RespondRequest",
    "ResponseEvent",
    "RotateResult",
    "SessionHeartbeatRequest",
    "SnapshotEvent",
    "StateEvent",
    "SubscribeRequest",
    "SubscribeResult",
    "ToolCallRequest",
    "ToolCallResult",
    "ToolsList",
    "ToolsQuery",
    "parse_body",
    "parse_model",
]

MAX_TIMEOUT_S = 3600.0
MIN_TIMEOUT_S = 1.0  # less is no time for a mesh round trip on a loaded host: a 504 by design
RESERVED_SESSION_IDS = ("register", "heartbeat")  # path segments of /v1/agents/...
TASKS_SUMMARY_MAX_BYTES = 4096

# ASCII printable without space and '@' (the mesh takes more: any printable characters; the
# gateway takes what a JSON-schema pattern can say exactly, so a client generated from the
# document never sends a name the mesh then refuses).
def _not_system(name: str) -> str:
    if name.startswith("meshd.sys."):
        raise ValueError("names starting with 'meshd.sys.' are reserved for daemons")
    return name


def _not_reserved(session_id: str) -> str:
    if session_id in RESERVED_SESSION_IDS:
        raise ValueError(f"{session_id!r} is a path segment of /v1/agents/, not a session id")
    return session_id


AgentName = Annotated[str, StringConstraints(min_length=1, max_length=P.MAX_NAME_LEN,
                                             pattern=r"^[!-?A-~]+$"), AfterValidator(_not_system),
                      Field(description="An agent name: 1-128 ASCII printable characters, no space or '@'. "
                                        "Names starting with 'meshd.sys.' are the daemons' own.",
                            json_schema_extra={"not": {"pattern": r"^meshd\.sys\."}})]
Target = Annotated[str, StringConstraints(min_length=1, max_length=P.MAX_NAME_LEN * 3),
                   Field(description="An agent: 'name' or 'name@node' (node id or node name). A name "
                                     "not in the mesh directory is a 404 NO_SUCH_AGENT.")]
Topic = Annotated[str, StringConstraints(min_length=1, max_length=P.MAX_TOPIC_LEN, pattern=r"^[ -~]+$"),
                  Field(description="1-256 ASCII printable characters.")]
SessionId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_~-]+$"),
                      AfterValidator(_not_reserved),
                      Field(description="A session id from POST /v1/agents/register (letters, digits, "
                                        "'_', '~', '-'; not 'register' or 'heartbeat').",
                            json_schema_extra={"not": {"enum": list(RESERVED_SESSION_IDS)}})]
_WILDCARD_TOKEN = r"(^|\.)[*>](\.|$)"


def _no_wildcard(topic: str) -> str:
    if T.is_pattern(topic):
        raise ValueError("a topic with a wildcard token ('*', '>') is for subscriptions only")
    return topic


def _well_formed_pattern(topic: str) -> str:
    if T.is_pattern(topic):
        problem = T.pattern_problem(topic, max_tokens=1 << 30)
        if problem is not None:
            raise ValueError(problem)
    return topic


PublishTopic = Annotated[str,
                         StringConstraints(min_length=1, max_length=P.MAX_TOPIC_LEN, pattern=r"^[ -~]+$"),
                         AfterValidator(_no_wildcard),
                         Field(description="1-256 ASCII printable characters; no token (between dots) "
                                           "that is '*' or '>' (those are for subscriptions).",
                               json_schema_extra={"not": {"pattern": _WILDCARD_TOKEN}})]
SubscribeTopic = Annotated[
    str, StringConstraints(min_length=1, max_length=P.MAX_TOPIC_LEN, pattern=r"^[ -~]+$"),
    AfterValidator(_well_formed_pattern),
    Field(description="A topic, or a wildcard pattern on dot-separated tokens: '*' one token, '>' the "
                      "rest (last token only); a pattern has no empty token (docs/PROTOCOL.md §11.1).",
          json_schema_extra={"not": {"anyOf": [
              {"pattern": r"(^|\.)>\."},
              {"allOf": [{"pattern": _WILDCARD_TOKEN}, {"pattern": r"(^\.|\.\.|\.$)"}]}]}})]
Text256 = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Capability = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[!-~]+$")]
Timeout = Annotated[float, Field(ge=MIN_TIMEOUT_S, le=MAX_TIMEOUT_S, description="Seconds, 1 to 3600.")]


def _whole(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer: so does the gateway (strict otherwise: no "3", no true)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Count = Annotated[int, Strict(), Ge(0), Le(10**9), BeforeValidator(_whole)]
Qos = Annotated[int, Strict(), Ge(0), Le(1), BeforeValidator(_whole),
                Field(description="0: at most once; 1: at least once (stored until acked).")]
Priority = Annotated[int, Strict(), Ge(0), Le(P.MAX_PRIORITY), BeforeValidator(_whole),
                     Field(description="0 (urgent, served first) to 9; default 5 (docs/PROTOCOL.md §8.10).")]


ABSENT_MARK = "x-meshd-absent"
"""Marks, in a generated schema, a field that may be left out but is not null: the document
builder drops the mark and the field's sentinel ``default`` (meshd.gateway.openapi)."""


def _absent(sentinel: Any, description: str | None = None) -> Any:
    """Field default for 'may be left out, not null': ``sentinel`` (never valid, never shown) means
    left out, so the field's type stays non-null."""
    return Field(default=sentinel, description=description, json_schema_extra={ABSENT_MARK: True})


def _one_of_required(*groups: tuple[str, ...]) -> dict[str, Any]:
    """JSON schema: at least one field of each group (a group: one tuple of field names)."""
    rules = [{"anyOf": [{"required": [f]} for f in group]} for group in groups]
    return rules[0] if len(rules) == 1 else {"allOf": rules}


class _Body(BaseModel):
    """A request body: unknown keys are ignored (a newer client may send more)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class _Answer(BaseModel):
    """A response body whose every key is listed."""

    model_config = ConfigDict(extra="forbid")


class _Record(BaseModel):
    """A record that comes from elsewhere in the mesh: more keys may come from newer daemons."""

    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------- errors


class ErrorDetail(_Answer):
    code: str = Field(description="BAD_REQUEST, NO_SUCH_AGENT, TIMEOUT, ... (docs/http.md)")
    message: str
    field: str = _absent("", "The request field at fault (dotted path), for a bad field.")
    retry_after: float = _absent(0.0, "Seconds to wait before trying again.")


class ErrorBody(_Answer):
    """Every error answer but 401 (empty) and aiohttp's own 400 for an unparsable request line or
    header (text/plain)."""

    error: ErrorDetail


# --------------------------------------------------------------------------- the coms-net contract


class ContractSpec(_Body):
    """A typed topic the HTTP agent serves (docs/contracts.md): the gateway validates what arrives
    on it against ``accepts`` before it becomes a prompt event."""

    topic: Topic
    version: str = Field(default="1.0", pattern=r"^[0-9]{1,5}\.[0-9]{1,5}$", description="MAJOR.MINOR")
    description: str = Field(default="", max_length=4096)
    accepts: dict[str, Any] | None = Field(default=None, description="JSON Schema of the payload.")
    returns: dict[str, Any] | None = Field(default=None, description="JSON Schema of the reply.")
    examples: list[Any] = Field(default_factory=list, max_length=8)


class RegisterRequest(_Body):
    name: AgentName
    session_id: SessionId = _absent("", "Register again under this id (it is kept).")
    project: Text256 | None = None
    model: Text256 | None = None
    colour: Text256 | None = None
    capabilities: list[Capability] = Field(default_factory=list, max_length=64)
    contracts: list[ContractSpec] = Field(
        default_factory=list, max_length=64,
        description="Typed topics (JSON Schema contracts) this agent serves; advertised in the mesh "
                    "directory, and what arrives on them is validated here first.")


class RegisterResult(_Answer):
    session_id: str
    name: str
    node: str
    node_name: str
    sse_url: str
    heartbeat_url: str
    heartbeat_interval_s: float
    stale_after_s: float
    offline_after_s: float


class HeartbeatTelemetry(_Body):
    context_used_pct: float | None = Field(default=None, ge=0, le=100)
    queue_depth: Count | None = None
    tasks_summary: Any = Field(default=None, description=f"Any JSON, at most {TASKS_SUMMARY_MAX_BYTES} "
                                                         "bytes encoded.")

    @model_validator(mode="after")
    def _summary_size(self) -> HeartbeatTelemetry:
        if self.tasks_summary is not None and len(json.dumps(self.tasks_summary)) > TASKS_SUMMARY_MAX_BYTES:
            raise ValueError(f"'tasks_summary' must encode to at most {TASKS_SUMMARY_MAX_BYTES} bytes "
                             "of JSON")
        return self


class HeartbeatRequest(HeartbeatTelemetry):
    """POST /v1/agents/{session_id}/heartbeat (the body may be left out)."""

    telemetry: HeartbeatTelemetry | None = _absent(None, "The telemetry nested (not at the top level).")


class SessionHeartbeatRequest(HeartbeatRequest):
    """POST /v1/agents/heartbeat: the session id is in the body."""

    session_id: SessionId


class HeartbeatResult(_Answer):
    ok: Literal[True]
    pending_requests: int


class MessageRequest(_Body):
    model_config = ConfigDict(json_schema_extra=_one_of_required(("sender_session", "session_id"),
                                                                 ("prompt", "payload")))
    sender_session: SessionId = _absent("", "The sender's session id (or session_id).")
    session_id: SessionId = _absent("", "Same as sender_session.")
    target: Target
    prompt: str = _absent("", "Sent as the payload {prompt, tasks}.")
    payload: Any = Field(default=None, description="Any JSON (instead of prompt).")
    tasks: Any = Field(default=None, description="Any JSON, sent with prompt.")
    topic: Topic = "prompt"
    expects_response: bool = True
    timeout: Timeout = 30.0
    qos: Qos = 0
    priority: Priority = P.DEFAULT_PRIORITY

    @model_validator(mode="after")
    def _needs(self) -> MessageRequest:
        if not self.sender_session and not self.session_id:
            raise ValueError("'sender_session' is required (the session_id from /v1/agents/register)")
        if not {"payload", "prompt"} & self.model_fields_set:
            raise ValueError("one of 'prompt' or 'payload' is required")
        return self


class MessageAccepted(_Answer):
    msg_id: str
    expects_response: bool


class RespondRequest(_Body):
    model_config = ConfigDict(json_schema_extra=_one_of_required(("response", "payload", "error")))
    session_id: SessionId = _absent("", "The answering session (checked when given).")
    response: Any = Field(default=None, description="Sent as the payload {response: ...}.")
    payload: Any = Field(default=None, description="Any JSON, sent as is.")
    error: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = _absent(
        "", "Fail the request: the requester gets HANDLER_ERROR with this message.")

    @model_validator(mode="after")
    def _needs(self) -> RespondRequest:
        if not {"response", "payload", "error"} & self.model_fields_set:
            raise ValueError("one of 'response', 'payload' or 'error' is required")
        return self


class DelegateRequest(_Body):
    target: Target
    topic: Topic = _absent("", "A new topic for the delegate (default: the request's).")


class OkResult(_Answer):
    ok: Literal[True]


# --------------------------------------------------------------------------- meshd's own endpoints


class AgentRecord(_Record):
    name: str
    node: str
    node_name: str | None = None
    capabilities: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    topics: list[str] = Field(default_factory=list)
    durable: list[str] = Field(default_factory=list)
    registered_at: float | None = None
    reg: int | None = None
    state: str | None = Field(default=None, description="online, stale")
    telemetry: dict[str, Any] = Field(default_factory=dict)


class ContractRecord(_Record):
    """One typed topic an agent serves, at one version (docs/contracts.md, PROTOCOL.md §17.1)."""

    topic: str
    version: str = Field(description="MAJOR.MINOR")
    description: str = ""
    accepts: dict[str, Any] | None = Field(default=None, description="JSON Schema of the payload.")
    returns: dict[str, Any] | None = Field(default=None, description="JSON Schema of the reply.")
    examples: list[Any] = Field(default_factory=list)


class AgentContracts(_Answer):
    name: str
    node: str | None = None
    node_name: str | None = None
    contracts: list[ContractRecord]


class PeerRecord(_Record):
    node: str
    name: str | None = None
    state: str = Field(description="discovered, online, stale, offline")
    router: str | None = None
    pub: str | None = None
    source: str | None = None
    agents: int = 0
    last_seen_ago: float | None = None
    confirmed_ago: float | None = None
    key: str | None = None
    duplicate: Any = None


class GatewayStats(_Answer):
    sessions: int
    streams: int
    slow_disconnects: int
    closed_streams: int
    auth_refused: int
    bad_requests: int = Field(description="Requests aiohttp's parser refused (400 before any route).")
    checked_responses: int = Field(description="Answers checked against their model (http_check_responses).")
    invalid_responses: int = Field(description="Answers that did not fit (answered 500 RESPONSE_INVALID).")


class NodeInfo(_Record):
    node: str
    name: str
    mesh: str
    routers: list[str]
    pubs: list[str]
    socket: str
    insecure: bool
    uptime: float
    agents: int
    peers: int
    stats: dict[str, int]
    dead_letters: int
    gateway: GatewayStats


class DeadLetter(_Answer):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    seq: int
    at: float
    reason: str
    detail: str | None = None
    attempts: int | None = None
    kind: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    topic: str | None = None


AgentsList = list[AgentRecord]
PeersList = list[PeerRecord]
DeadLettersList = list[DeadLetter]


class RequestRequest(_Body):
    model_config = ConfigDict(json_schema_extra=_one_of_required(("session_id", "sender_session")))
    session_id: SessionId = _absent("", "The requester's session id (or sender_session).")
    sender_session: SessionId = _absent("", "Same as session_id.")
    target: Target
    topic: Topic = "request"
    payload: Any = None
    timeout: Timeout = 30.0
    priority: Priority = P.DEFAULT_PRIORITY

    @model_validator(mode="after")
    def _needs(self) -> RequestRequest:
        if not self.sender_session and not self.session_id:
            raise ValueError("'session_id' is required (the session_id from /v1/agents/register)")
        return self


class RequestResult(_Answer):
    ok: Literal[True]
    payload: Any
    latency_ms: float


class GatherRequest(_Body):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        _one_of_required(("session_id", "sender_session")),
        {"oneOf": [{"required": ["to"]}, {"required": ["capability"]}, {"required": ["subscribers_of"]}]}]})
    session_id: SessionId = _absent("", "The requester's session id (or sender_session).")
    sender_session: SessionId = _absent("", "Same as session_id.")
    to: Annotated[list[AgentName], Field(min_length=1, max_length=GATHER_MAX_TARGETS)] = _absent(
        [], "The targets by name (or capability, or subscribers_of: exactly one of the three).")
    capability: Capability = _absent("", "Every agent of the mesh with this capability.")
    subscribers_of: PublishTopic = _absent("", "Every agent subscribed to this topic, exactly or by a "
                                           "pattern.")
    topic: Topic = "request"
    payload: Any = None
    want: Annotated[int, Strict(), Ge(1), Le(GATHER_MAX_TARGETS), BeforeValidator(_whole)] = _absent(
        0, "Stop after this many replies (left out: wait for every target).")
    timeout: Timeout = 30.0
    priority: Priority = P.DEFAULT_PRIORITY

    @model_validator(mode="after")
    def _needs(self) -> GatherRequest:
        if not self.sender_session and not self.session_id:
            raise ValueError("'session_id' is required (the session_id from /v1/agents/register)")
        if sum(bool(x) for x in (self.to, self.capability, self.subscribers_of)) != 1:
            raise ValueError("exactly one of 'to', 'capability' or 'subscribers_of'")
        return self


class GatherReplyRecord(_Answer):
    sender: str = Field(description="The target that replied.")
    payload: Any


class GatherSummaryRecord(_Answer):
    targets: list[str]
    replied: list[str]
    errors: dict[str, str] = Field(description="Target -> error code (HANDLER_ERROR, ...).")
    timed_out: list[str]
    unreachable: list[str]
    cancelled: list[str] = Field(description="Not waited for: want was reached first.")
    ended: Literal["want", "all", "timeout", "cancelled"]


class GatherResult(_Answer):
    replies: list[GatherReplyRecord] = Field(description="In the order they arrived.")
    summary: GatherSummaryRecord
    latency_ms: float


class HandoffRequest(RequestRequest):
    task_id: Text256
    context: Any = None
    artifacts: Any = None


class HandoffResult(_Answer):
    accepted: bool
    reason: str | None
    data: Any


class PublishRequest(_Body):
    model_config = ConfigDict(json_schema_extra=_one_of_required(("session_id", "sender_session")))
    session_id: SessionId = _absent("", "The publisher's session id (or sender_session).")
    sender_session: SessionId = _absent("", "Same as session_id.")
    topic: PublishTopic
    payload: Any = None
    qos: Qos = 0
    priority: Priority = P.DEFAULT_PRIORITY

    @model_validator(mode="after")
    def _needs(self) -> PublishRequest:
        if not self.sender_session and not self.session_id:
            raise ValueError("'session_id' is required (the session_id from /v1/agents/register)")
        return self


class PublishResult(_Answer):
    subscribers: int


class SubscribeRequest(_Body):
    session_id: SessionId
    topic: SubscribeTopic
    durable: bool = False


class SubscribeResult(_Answer):
    ok: Literal[True]
    topic: str


class ToolsQuery(_Body):
    session_id: SessionId
    format: Literal["openai", "anthropic", "mcp"] | None = Field(
        default=None, description="Give the tools in that API's shape.")


class ToolsList(_Answer):
    tools: list[dict[str, Any]]


class ToolCallRequest(_Body):
    session_id: SessionId
    args: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")
    timeout: Timeout = _absent(0.0, "Seconds (default approval_timeout + 5, so a held call can be decided).")


class ToolCallResult(_Answer):
    ok: Literal[True]
    result: Any
    latency_ms: float


class RotateResult(_Answer):
    ok: Literal[True]
    token_file: str


# --------------------------------------------------------------------------- SSE events


class MessageEvent(_Answer):
    """``prompt`` (a message or request to this agent) and ``publication`` (a topic it follows)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    msg_id: str
    from_: str = Field(alias="from")
    topic: str | None
    payload: Any
    kind: str
    qos: int
    prompt: str | None = _absent("", "When the payload is an object with a string 'prompt'.")
    tasks: Any = Field(default=None, description="When the payload is an object with 'tasks'.")
    expects_response: bool | None = _absent(None, "prompt events: whether a response is awaited.")
    deadline_in_s: float | None = Field(default=None, description="prompt events that await a response.")


class ResponseEvent(_Answer):
    """The answer to a message this agent sent (POST /v1/messages)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    msg_id: str
    from_: str = Field(alias="from")
    ok: bool
    payload: Any = None
    response: str | None = _absent("", "When the answer is an object with a string 'response'.")
    latency_ms: float | None = _absent(None)
    error: ErrorDetail | None = _absent(None, "ok false: why.")


class StateEvent(_Answer):
    """``agent_state`` and ``peer_state``: a change anywhere in the mesh."""

    name: str | None = None
    node: str | None = None
    node_name: str | None = None
    old: str
    new: str


class GapEvent(_Answer):
    """Events first..last fell out of the buffer before this reader got them."""

    first: int
    last: int
    missed: int


class SnapshotEvent(_Record):
    """The dashboard's view, twice a second while open."""

    at: float
    node: dict[str, Any]
    nodes: list[dict[str, Any]]
    agents: list[dict[str, Any]]
    outcomes: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    dead_letters_total: int
    qos1: dict[str, Any]
    gateway: GatewayStats


AGENT_EVENTS: dict[str, type[BaseModel]] = {
    "prompt": MessageEvent, "publication": MessageEvent, "response": ResponseEvent,
    "agent_state": StateEvent, "peer_state": StateEvent, "gap": GapEvent,
}
DASHBOARD_EVENTS: dict[str, type[BaseModel]] = {"snapshot": SnapshotEvent, "gap": GapEvent}


# --------------------------------------------------------------------------- parsing


MESH_RULED = frozenset({"name", "topic"})
"""Fields whose refusal is VALIDATION_FAILED (a name or topic the mesh would refuse), as docs/http.md
says; any other field that does not fit is BAD_REQUEST."""


def _field_of(err: Any) -> str:
    return ".".join(str(p) for p in err.get("loc", ()))


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: Any) -> M:
    """``data`` checked against ``model``; BadRequest naming the first field at fault."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = _field_of(first)
        reason = str(first.get("msg", "invalid"))
        if reason.startswith("Value error, "):
            reason = reason[len("Value error, "):]
        named = re.match(r"'(\w+)'", reason)
        if not where and named:  # a rule across fields names the field it asks for first
            return_field = named.group(1)
            raise BadRequest(reason, details={"field": return_field}) from None
        message = f"field {where!r}: {reason}" if where else reason
        details = {"field": where} if where else None
        if where in MESH_RULED and first.get("type") != "string_type":  # a string, but not a valid one
            raise ValidationFailed(message, details=details) from None
        raise BadRequest(message, details=details) from None


_INT_RANGE = range(-(2**63), 2**64)  # what msgpack carries as an integer


def _json_int(text: str) -> int | float:
    """A JSON integer; one past 64 bits becomes a float, as JavaScript reads every number (the mesh
    carries msgpack, whose integers stop at 64 bits; a JSON number is a number either way)."""
    value = int(text)
    return value if value in _INT_RANGE else float(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_body(model: type[M], raw: bytes) -> M:
    """A request body (bytes) as ``model``: malformed JSON, a non-object or a bad field is a 400."""
    if not raw:
        raise BadRequest("empty body: send a JSON object")
    try:
        data = json.loads(raw, parse_int=_json_int, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(data).__name__}")
    return parse_model(model, data)
