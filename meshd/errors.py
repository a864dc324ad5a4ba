"""Typed errors: one base class, one subclass per wire error code.

Callers catch ``MeshError`` for everything, a specific class for one failure, or the builtin it
also derives from (``TimeoutError``, ``LookupError``, ``ValueError``, ``ConnectionError``).
"""

from __future__ import annotations

from typing import Any


class MeshError(Exception):
    """Base of every meshd error. ``code`` is the wire error code (see docs/PROTOCOL.md)."""

    code: str = "ERROR"
    retryable: bool = False

    def __init__(
        self,
        message: str = "",
        *,
        retry_after: float | None = None,
        remote_type: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.retry_after = retry_after
        self.remote_type = remote_type
        self.details = details or {}


class NoSuchAgent(MeshError, LookupError):
    """The addressed agent is not in the mesh directory."""

    code = "NO_SUCH_AGENT"


class NameTaken(MeshError, ValueError):
    """The agent name is already registered somewhere in the mesh."""

    code = "NAME_TAKEN"


class InboxFull(MeshError):
    """The receiving agent's inbox is at its cap (backpressure): retry later."""

    code = "INBOX_FULL"
    retryable = True


class HopLimit(MeshError):
    """A message was forwarded more times than the hop limit allows."""

    code = "HOP_LIMIT"


class PeerUnreachable(MeshError, ConnectionError):
    """The daemon that hosts the target agent cannot be reached right now."""

    code = "PEER_UNREACHABLE"
    retryable = True


class HandlerError(MeshError):
    """The remote handler raised; ``remote_type`` and ``message`` say what it raised."""

    code = "HANDLER_ERROR"


class RequestTimeout(MeshError, TimeoutError):
    """No reply arrived before the request's deadline."""

    code = "TIMEOUT"
    retryable = True


class ValidationFailed(MeshError, ValueError):
    """A message or argument was refused as malformed."""

    code = "VALIDATION_FAILED"


class TooLarge(MeshError, ValueError):
    """A message exceeds the configured size limit and was refused at the edge."""

    code = "TOO_LARGE"


class NotRegistered(MeshError):
    """The connection sent a message before registering a name."""

    code = "NOT_REGISTERED"


class Cancelled(MeshError):
    """The requester cancelled the request; the handler was told."""

    code = "CANCELLED"


class Undeliverable(MeshError):
    """A qos-1 message could not be delivered within its attempts or time to live."""

    code = "UNDELIVERABLE"


class DaemonUnreachable(MeshError, ConnectionError):
    """The local meshd daemon did not answer on its agent socket."""

    code = "DAEMON_UNREACHABLE"
    retryable = True


class StartupError(MeshError, RuntimeError):
    """The daemon cannot start: no usable interface, the agent socket path taken or not a socket.

    ``step`` names the start-up step that failed (see ``meshd.node.START_STEPS``).
    """

    code = "STARTUP_ERROR"

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


class ConfigError(MeshError, ValueError):
    """A configuration value is invalid; ``key`` names the setting."""

    code = "CONFIG_ERROR"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


ERRORS_BY_CODE: dict[str, type[MeshError]] = {
    cls.code: cls
    for cls in (
        NoSuchAgent,
        NameTaken,
        InboxFull,
        HopLimit,
        PeerUnreachable,
        HandlerError,
        RequestTimeout,
        ValidationFailed,
        TooLarge,
        NotRegistered,
        DaemonUnreachable,
        Cancelled,
        Undeliverable,
    )
}


def error_from_wire(wire: Any) -> MeshError:
    """Turn the ``error`` map of an error envelope into the matching typed exception."""
    if not isinstance(wire, dict):
        return MeshError(f"malformed error envelope: {wire!r}")
    code = str(wire.get("code", "ERROR"))
    cls = ERRORS_BY_CODE.get(code, MeshError)
    retry_after = wire.get("retry_after")
    err = cls(
        str(wire.get("message", code)),
        retry_after=float(retry_after) if isinstance(retry_after, (int, float)) else None,
        remote_type=str(wire["type"]) if wire.get("type") else None,
    )
    if cls is MeshError:
        err.code = code
    return err
