"""The OpenAPI 3.1 description served at ``GET /v1/openapi.json``.

Owns: the machine-readable list of the gateway's endpoints, their bodies and error answers.
Must not touch: anything at run time but the gateway's own URL. docs/http.md is the prose version;
tests/integration/test_gateway.py checks that every route is described here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ROUTES", "openapi_spec"]

_ERR = {"$ref": "#/components/schemas/Error"}
_OBJ: dict[str, Any] = {"type": "object"}
_JSON_ERR = {"application/json": {"schema": _ERR}}

# (method, path, summary, required body fields, optional body fields)
ROUTES: list[tuple[str, str, str, list[str], list[str]]] = [
    ("get", "/", "The live dashboard page (the only path served without the token; it holds no data).",
     [], []),
    ("get", "/v1/openapi.json", "This document.", [], []),
    ("post", "/v1/agents/register", "Register an HTTP agent; returns session_id and sse_url.",
     ["name"], ["session_id", "project", "model", "colour", "capabilities"]),
    ("get", "/v1/agents", "Every agent in the mesh directory (all nodes).", [], []),
    ("get", "/v1/agents/{session_id}/events",
     "The agent's SSE stream: prompt, response, publication, agent_state, peer_state, gap. "
     "Send Last-Event-ID to resume.", [], []),
    ("post", "/v1/agents/{session_id}/heartbeat", "Heartbeat with telemetry.", [],
     ["context_used_pct", "queue_depth", "tasks_summary"]),
    ("post", "/v1/agents/heartbeat", "Heartbeat with telemetry (session_id in the body).", ["session_id"],
     ["context_used_pct", "queue_depth", "tasks_summary"]),
    ("delete", "/v1/agents/{session_id}", "Unregister the agent (its pending requests fail).", [], []),
    ("post", "/v1/messages", "Send a prompt or payload to an agent; the answer comes as a response event.",
     ["sender_session", "target"],
     ["prompt", "payload", "topic", "tasks", "expects_response", "timeout", "qos"]),
    ("post", "/v1/messages/{msg_id}/response", "Answer a request received as a prompt event.", [],
     ["session_id", "response", "payload", "error"]),
    ("post", "/v1/messages/{msg_id}/delegate",
     "Forward a request received as a prompt event; the reply goes straight to the requester.",
     ["target"], ["topic"]),
    ("get", "/v1/peers", "The daemons this daemon knows, with their state.", [], []),
    ("get", "/v1/node", "This daemon's identity, endpoints and counters (and the gateway's).", [], []),
    ("get", "/v1/deadletters", "Dead letters kept by this daemon.", [], []),
    ("post", "/v1/request", "Request and wait for the reply in one call.", ["session_id", "target"],
     ["topic", "payload", "timeout"]),
    ("post", "/v1/handoff", "Hand a task to an agent; returns its verdict.",
     ["session_id", "target", "task_id"],
     ["context", "artifacts", "timeout"]),
    ("post", "/v1/publish", "Publish on a topic; returns how many subscribers it reached.",
     ["session_id", "topic"], ["payload", "qos"]),
    ("post", "/v1/subscribe", "Receive publications on a topic as publication events.",
     ["session_id", "topic"],
     ["durable"]),
    ("post", "/v1/unsubscribe", "Stop receiving a topic.", ["session_id", "topic"], []),
    ("get", "/v1/tools",
     "The daemon's syscall tools (name, description, input_schema, side_effects, plugin), listed as the "
     "HTTP agent of query parameter session_id; ?format=openai|anthropic|mcp gives that API's shape.",
     [], []),
    ("post", "/v1/tools/{name}",
     "Call a syscall tool as the HTTP agent session_id (authorization, quota, validation and approval "
     "apply as to any agent); returns ok, result, latency_ms.", ["session_id"], ["args", "timeout"]),
    ("post", "/v1/token/rotate", "Make a new token (written to http.token); the old one stops working.",
     [], []),
    ("get", "/v1/dashboard/events", "The dashboard's SSE stream of snapshot events.", [], []),
]


def openapi_spec(url: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for method, path, summary, required, optional in ROUTES:
        op: dict[str, Any] = {"summary": summary, "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _OBJ}}},
            "400": {"description": "Malformed JSON or a bad field (the reason is in the body)",
                    "content": {"application/json": {"schema": _ERR}}},
            "401": {"description": "Missing or wrong bearer token (empty body)"},
            "403": {"description": "FORBIDDEN or APPROVAL_DENIED (tools)", "content": _JSON_ERR},
            "404": {"description": "NO_SUCH_AGENT, NO_SUCH_REQUEST or NO_SUCH_TOOL", "content": _JSON_ERR},
            "413": {"description": "Body over http_max_body_bytes", "content": _JSON_ERR},
            "429": {"description": "A bound reached (sessions, streams, in-flight messages, inbox)",
                    "content": {"application/json": {"schema": _ERR}}},
        }}
        if path == "/":
            op["security"] = []
        if "{" in path:
            name = path.split("{", 1)[1].split("}", 1)[0]
            op["parameters"] = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}]
        if path == "/v1/tools":
            op["parameters"] = [
                {"name": "session_id", "in": "query", "required": True, "schema": {"type": "string"}},
                {"name": "format", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": ["openai", "anthropic", "mcp"]}}]
        if method == "post" and (required or optional):
            props: dict[str, Any] = {f: {} for f in required + optional}
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": required, "properties": props}}}}
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "meshd HTTP/SSE gateway", "version": "1",
                 "description": "See docs/http.md. Every path but / needs Authorization: Bearer TOKEN "
                                "(the token is in http.token in the daemon's runtime dir)."},
        "servers": [{"url": url}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
                "code": {"type": "string"}, "message": {"type": "string"},
                "retry_after": {"type": "number"}}}}}},
        },
        "paths": paths,
    }
