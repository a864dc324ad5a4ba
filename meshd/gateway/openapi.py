"""The OpenAPI 3.1 description served at ``GET /v1/openapi.json``, generated from the models.

Owns: :data:`ROUTES` (every operation: method, path, summary, the model of its body or query,
its answers by status: a model, or a content type that is not JSON) and :func:`openapi_spec`,
which builds the document from them: the bodies' JSON schemas come from the pydantic models of
meshd.gateway.models (``TypeAdapter.json_schema`` with ``ref_template`` into
``components/schemas``), the same ones that validate each request and, with
``http_check_responses``, each answer. :func:`response_model` tells the gateway which model an
answer must fit.
Must not touch: anything at run time but the gateway's own URL. docs/http.md is the prose version;
tests/integration/test_gateway_openapi.py fuzzes a real gateway from this document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import TypeAdapter

from meshd.gateway import models as M

__all__ = ["AGENT_STREAM", "DASHBOARD_STREAM", "ROUTES", "Route", "openapi_spec", "response_model"]

HTML = "text/html"
SSE = "text/event-stream"
EMPTY = "empty"  # an answer without a body (204)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    body: type[Any] | None = None  # the request body's model
    query: type[Any] | None = None  # the query parameters' model
    answers: dict[int, Any] = field(default_factory=dict)  # status -> model, HTML, SSE or EMPTY
    public: bool = False  # served without the token
    body_optional: bool = False  # the body may be left out
    errors: tuple[int, ...] = ()  # error statuses beyond 400/401/404/413/429 (the rest: default)


_SSE_NOTE = " Send Last-Event-ID to resume."


@dataclass(frozen=True)
class _Stream:
    """A text/event-stream answer: its events by name, each with the model of its JSON data."""

    events: tuple[tuple[str, Any], ...]


AGENT_STREAM = _Stream(tuple(M.AGENT_EVENTS.items()))
DASHBOARD_STREAM = _Stream(tuple(M.DASHBOARD_EVENTS.items()))


def _event_schema(schemas: _Schemas, events: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """One event of the stream (OpenAPI 3.1: the schema of a text/event-stream describes each
    event): its name, its id (none on gap), and its data, one line of JSON of the event's model."""
    variants = []
    for name, model in events:
        variant: dict[str, Any] = {"properties": {
            "event": {"const": name},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": schemas.ref(model)}}}
        if name != "gap":
            variant["required"] = ["id"]
        variants.append(variant)
    return {"type": "object", "required": ["event", "data"],
            "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"},
                           "event": {"enum": sorted({n for n, _ in events})},
                           "data": {"type": "string"}},
            "oneOf": variants}

ROUTES: list[Route] = [
    Route("get", "/", "The live dashboard page (the only path served without the token; it holds no data).",
          answers={200: HTML}, public=True),
    Route("get", "/favicon.ico", "No icon (served without the token, so browsers do not ask for one).",
          answers={204: EMPTY}, public=True),
    Route("get", "/v1/openapi.json", "This document.", answers={200: dict[str, Any]}),
    Route("post", "/v1/agents/register", "Register an HTTP agent; returns session_id and sse_url.",
          body=M.RegisterRequest, answers={200: M.RegisterResult}, errors=(409,)),
    Route("get", "/v1/agents", "Every agent in the mesh directory (all nodes), sorted by name.",
          answers={200: M.AgentsList}),
    Route("get", "/v1/agents/{agent}/contracts",
          "The contracts an agent advertises (its typed topics, their versions and JSON Schemas); [] if "
          "it has none, 404 NO_SUCH_AGENT if the directory does not know it.",
          answers={200: M.AgentContracts}),
    Route("get", "/v1/agents/{session_id}/events",
          "The agent's SSE stream: prompt, response, publication, agent_state, peer_state, gap." + _SSE_NOTE,
          answers={200: AGENT_STREAM}),
    Route("post", "/v1/agents/{session_id}/heartbeat", "Heartbeat with telemetry (the body may be left out).",
          body=M.HeartbeatRequest, body_optional=True, answers={200: M.HeartbeatResult}),
    Route("post", "/v1/agents/heartbeat", "Heartbeat with telemetry (session_id in the body).",
          body=M.SessionHeartbeatRequest, answers={200: M.HeartbeatResult}),
    Route("delete", "/v1/agents/{session_id}", "Unregister the agent (its pending requests fail).",
          answers={200: M.OkResult}),
    Route("post", "/v1/messages",
          "Send a prompt or payload to an agent; the answer comes as a response event.",
          body=M.MessageRequest, answers={202: M.MessageAccepted}),
    Route("post", "/v1/messages/{msg_id}/response", "Answer a request received as a prompt event.",
          body=M.RespondRequest, answers={200: M.OkResult}),
    Route("post", "/v1/messages/{msg_id}/delegate",
          "Forward a request received as a prompt event; the reply goes straight to the requester.",
          body=M.DelegateRequest, answers={200: M.OkResult}),
    Route("get", "/v1/peers", "The daemons this daemon knows, with their state, sorted by node id.",
          answers={200: M.PeersList}),
    Route("get", "/v1/node", "This daemon's identity, endpoints and counters (and the gateway's).",
          answers={200: M.NodeInfo}),
    Route("get", "/v1/deadletters", "Dead letters kept by this daemon, oldest first (at most 1024).",
          answers={200: M.DeadLettersList}),
    Route("post", "/v1/request", "Request and wait for the reply in one call.",
          body=M.RequestRequest, answers={200: M.RequestResult}),
    Route("post", "/v1/handoff", "Hand a task to an agent; returns its verdict.",
          body=M.HandoffRequest, answers={200: M.HandoffResult}),
    Route("post", "/v1/gather",
          "Scatter-gather: request of every target (by name, capability or subscription, on every node) "
          "and wait until want replies, every target answered or failed, or the timeout; returns the "
          "replies and who replied, failed (with its code), timed out or was unreachable.",
          body=M.GatherRequest, answers={200: M.GatherResult}),
    Route("post", "/v1/publish", "Publish on a topic; returns how many subscribers it reached.",
          body=M.PublishRequest, answers={200: M.PublishResult}),
    Route("post", "/v1/subscribe", "Receive publications on a topic as publication events.",
          body=M.SubscribeRequest, answers={200: M.SubscribeResult}),
    Route("post", "/v1/unsubscribe", "Stop receiving a topic.",
          body=M.SubscribeRequest, answers={200: M.SubscribeResult}),
    Route("get", "/v1/tools",
          "The daemon's syscall tools (name, description, input_schema, side_effects, plugin), listed as the "
          "HTTP agent of query parameter session_id; ?format=openai|anthropic|mcp gives that API's shape.",
          query=M.ToolsQuery, answers={200: M.ToolsList}),
    Route("post", "/v1/tools/{name}",
          "Call a syscall tool as the HTTP agent session_id (authorization, quota, validation and approval "
          "apply as to any agent); returns ok, result, latency_ms.",
          body=M.ToolCallRequest, answers={200: M.ToolCallResult}, errors=(403,)),
    Route("post", "/v1/token/rotate", "Make a new token (written to http.token); the old one stops working.",
          answers={200: M.RotateResult}),
    Route("get", "/v1/dashboard/events", "The dashboard's SSE stream of snapshot events." + _SSE_NOTE,
          answers={200: DASHBOARD_STREAM}),
]

_REF = "#/components/schemas/{model}"
_STATUS_TEXT = {200: "OK", 202: "Accepted", 204: "No content", 400: "A bad request: malformed JSON, "
                "not an object, or a field that does not fit (error.field names it)", 403: "FORBIDDEN or "
                "APPROVAL_DENIED", 404: "NO_SUCH_AGENT (an unknown session_id or target), NO_SUCH_REQUEST or "
                "NO_SUCH_TOOL", 409: "NAME_TAKEN", 413: "TOO_LARGE: a body over http_max_body_bytes or a "
                "payload over max_payload_bytes", 429: "A bound reached (sessions, streams, in-flight "
                "messages, inbox, quota)"}

_SESSION_PARAM = TypeAdapter(M.SessionId).json_schema()
_PATH_PARAMS: dict[str, dict[str, Any]] = {
    "session_id": _SESSION_PARAM,
    "msg_id": {"type": "string", "minLength": 1, "maxLength": 256},
    "name": {"type": "string", "minLength": 1, "maxLength": 128},
    "agent": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": r"^[!-?A-~]+$"},
}


def _type_name(tp: Any) -> str:
    for name in dir(M):
        if getattr(M, name) is tp and name[0].isupper():
            return name
    return str(getattr(tp, "__name__", "Object"))


class _Schemas:
    """components/schemas, filled as models are referenced."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def ref(self, tp: Any) -> dict[str, Any]:
        if tp == dict[str, Any]:
            return {"type": "object"}
        name = _type_name(tp)
        if name not in self.defs:
            schema = _tidy(TypeAdapter(tp).json_schema(ref_template=_REF))
            for sub, body in schema.pop("$defs", {}).items():
                self.defs.setdefault(sub, body)
            self.defs[name] = schema
        return {"$ref": _REF.format(model=name)}


def _tidy(schema: Any) -> Any:
    """Drop the 'left out, not null' marks and their sentinel defaults (meshd.gateway.models)."""
    if isinstance(schema, dict):
        if schema.pop(M.ABSENT_MARK, False):
            schema.pop("default", None)
        return {k: _tidy(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_tidy(v) for v in schema]
    return schema


def _query_params(model: Any) -> list[dict[str, Any]]:
    schema = TypeAdapter(model).json_schema()
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        if "anyOf" in prop:  # a query value is never null: drop that branch
            kept = [s for s in prop.pop("anyOf") if s.get("type") != "null"]
            prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
            prop.pop("default", None)
        out.append({"name": name, "in": "query", "required": name in required, "schema": prop})
    return out


def _content(schemas: _Schemas, answer: Any) -> dict[str, Any] | None:
    if answer == EMPTY:
        return None
    if answer == HTML:
        return {HTML: {"schema": {"type": "string"}}}
    if isinstance(answer, _Stream):
        return {SSE: {"schema": _event_schema(schemas, answer.events)}}
    return {"application/json": {"schema": schemas.ref(answer)}}


def _operation(schemas: _Schemas, route: Route) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, answer in route.answers.items():
        entry: dict[str, Any] = {"description": _STATUS_TEXT.get(status, "OK")}
        content = _content(schemas, answer)
        if content is not None:
            entry["content"] = content
        responses[str(status)] = entry
    err = {"application/json": {"schema": schemas.ref(M.ErrorBody)}}
    if not route.public:
        if route.body is not None or route.query is not None or isinstance(route.answers.get(200), _Stream):
            responses["400"] = {"description": _STATUS_TEXT[400], "content": err}
        responses["401"] = {"description": "Missing or wrong bearer token (empty body)"}
        if "{" in route.path or route.body is not None or route.query is not None:
            responses["404"] = {"description": _STATUS_TEXT[404], "content": err}
        if route.body is not None:
            responses["413"] = {"description": _STATUS_TEXT[413], "content": err}
        responses["429"] = {"description": _STATUS_TEXT[429], "content": err}
        for status in route.errors:
            responses[str(status)] = {"description": _STATUS_TEXT[status], "content": err}
        responses["default"] = {"description": "A mesh error (502 HANDLER_ERROR, 504 TIMEOUT, ...: the "
                                               "table in docs/http.md)", "content": err}
    op: dict[str, Any] = {"summary": route.summary, "operationId": _operation_id(route),
                          "responses": responses}
    if route.public:
        op["security"] = []
    params: list[dict[str, Any]] = []
    for segment in route.path.split("/"):
        if segment.startswith("{"):
            name = segment[1:-1]
            params.append({"name": name, "in": "path", "required": True, "schema": _PATH_PARAMS[name]})
    if route.query is not None:
        params += _query_params(route.query)
    if isinstance(route.answers.get(200), _Stream):
        params.append({"name": "Last-Event-ID", "in": "header", "required": False,
                       "schema": {"type": "string", "pattern": "^[0-9]{0,18}$"}})
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": not route.body_optional,
                             "content": {"application/json": {"schema": schemas.ref(route.body)}}}
    return op


def _operation_id(route: Route) -> str:
    words = [w.strip("{}").replace(".", "_") for w in route.path.split("/") if w and w != "v1"]
    return "_".join([route.method, *words]) if words else f"{route.method}_page"


@cache
def _document() -> dict[str, Any]:
    schemas = _Schemas()
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(schemas, route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "meshd HTTP/SSE gateway", "version": "1",
                 "description": "See docs/http.md. Every path but / needs Authorization: Bearer TOKEN "
                                "(the token is in http.token in the daemon's runtime dir). Generated from "
                                "the pydantic models that validate each request (meshd/gateway/models.py)."},
        "security": [{"bearer": []}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                       "schemas": dict(sorted(schemas.defs.items()))},
        "paths": paths,
    }


def openapi_spec(url: str) -> dict[str, Any]:
    """The document, with this gateway's URL as its server."""
    return _document() | {"servers": [{"url": url}]}


@cache
def _adapters() -> dict[tuple[str, str, int], TypeAdapter[Any]]:
    out: dict[tuple[str, str, int], TypeAdapter[Any]] = {}
    for route in ROUTES:
        for status, answer in route.answers.items():
            if answer not in (HTML, EMPTY) and not isinstance(answer, _Stream):
                out[(route.method, route.path, status)] = TypeAdapter(answer)
    out[("*", "*", 0)] = TypeAdapter(M.ErrorBody)
    return out


def response_model(method: str, path: str, status: int) -> TypeAdapter[Any] | None:
    """The adapter an answer with ``status`` to ``method path`` (the route's template) must fit:
    the route's model for a success, the error body for an error; None for a non-JSON answer."""
    adapters = _adapters()
    if status < 400:
        return adapters.get((method.lower(), path, status))
    return adapters[("*", "*", 0)] if status != 401 else None
