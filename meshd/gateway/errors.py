"""The gateway's typed errors and how each maps to an HTTP status.

Owns: the error classes raised by the gateway's parts and :func:`http_status`, the one table from
an error code (the gateway's or the mesh's, meshd.errors) to an HTTP status.
Must not touch: sockets, sessions, aiohttp.
"""

from __future__ import annotations

from meshd.errors import MeshError

__all__ = ["BadRequest", "GatewayError", "NoSuchRequest", "NoSuchSession", "TooManyInFlight",
           "TooManySessions", "TooManyStreams", "http_status"]


class GatewayError(MeshError):
    """Base of the gateway's own errors."""

    code = "GATEWAY_ERROR"


class BadRequest(GatewayError, ValueError):
    """The body is not the JSON the endpoint takes (reason in the message)."""

    code = "BAD_REQUEST"


class NoSuchSession(GatewayError, LookupError):
    """No HTTP agent with that session id on this gateway (same code as an unknown mesh agent)."""

    code = "NO_SUCH_AGENT"


class NoSuchRequest(GatewayError, LookupError):
    """No pending request with that msg_id for this agent (answered, expired, or never was)."""

    code = "NO_SUCH_REQUEST"


class TooManySessions(GatewayError):
    """``http_max_sessions`` HTTP agents are registered already."""

    code = "TOO_MANY_SESSIONS"


class TooManyStreams(GatewayError):
    """``http_max_streams`` SSE streams are open already."""

    code = "TOO_MANY_STREAMS"


class TooManyInFlight(GatewayError):
    """The agent has ``inbox_cap`` messages awaiting a response already."""

    code = "TOO_MANY_IN_FLIGHT"


_STATUS = {
    "BAD_REQUEST": 400,
    "NOT_FOUND": 404,  # no such route
    "METHOD_NOT_ALLOWED": 405,
    "VALIDATION_FAILED": 400,
    "TOO_LARGE": 413,
    "NO_SUCH_AGENT": 404,
    "NO_SUCH_REQUEST": 404,
    "NAME_TAKEN": 409,
    "TOO_MANY_SESSIONS": 429,
    "TOO_MANY_STREAMS": 429,
    "TOO_MANY_IN_FLIGHT": 429,
    "INBOX_FULL": 429,
    "TIMEOUT": 504,
    "PEER_UNREACHABLE": 502,
    "UNDELIVERABLE": 502,
    "HOP_LIMIT": 508,
    "HANDLER_ERROR": 502,
    "CANCELLED": 409,
    "DAEMON_UNREACHABLE": 503,
    "NOT_REGISTERED": 503,
    # syscall tools (POST /v1/tools/{name}) and the services behind them
    "NO_SUCH_TOOL": 404,
    "NO_SUCH_TASK": 404,
    "NO_SUCH_TEMPLATE": 404,
    "NO_SUCH_APPROVAL": 404,
    "FORBIDDEN": 403,
    "APPROVAL_DENIED": 403,
    "QUOTA_EXCEEDED": 429,
    "QUEUE_FULL": 429,
    "SPAWN_QUOTA": 429,
    "TASK_STORE_FULL": 429,
    "TASK_FAILED": 502,
    "SPAWN_FAILED": 502,
    "NOT_WIRED": 501,
    "INTERNAL": 500,  # a gateway bug (logged with its traceback)
    "RESPONSE_INVALID": 500,  # http_check_responses: an answer that does not fit its model
}


def http_status(code: str) -> int:
    """The HTTP status for an error code (500 for one this table does not know)."""
    return _STATUS.get(code, 500)
