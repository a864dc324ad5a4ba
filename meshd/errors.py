"""Typed errors: one base class, one subclass per wire error code.

Callers catch ``MeshError`` for everything, a specific class for one failure, or the builtin it
also derives from (``TimeoutError``, ``LookupError``, ``ValueError``, ``ConnectionError``).
"""

from __future__ import annotations

from typing import Any


class MeshError(Exception):
    """Base of every meshd error. ``code`` is the wire error code (see docs/PROTOCOL.md)."""

    code: str = "ERROR"
    #: The class's default for ``retry``; an envelope's own ``retry`` overrides it per instance.
    retryable: bool = False
    #: Another agent (or topic) that could serve instead, if the refusing side named one.
    fallback: str | None = None
    #: Who sent the error envelope: ``meshd@<node id>`` when a daemon refused the message (it
    #: reached no handler), else the agent that answered with the error; None for an error raised
    #: in this process. Set by the client when the envelope arrives.
    sender: str | None = None

    def __init__(
        self,
        message: str = "",
        *,
        retry_after: float | None = None,
        remote_type: str | None = None,
        details: dict[str, Any] | None = None,
        retry: bool | None = None,
        fallback: str | None = None,
    ) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.retry_after = retry_after
        self.remote_type = remote_type
        self.details = details or {}
        if retry is not None:
            self.retryable = retry
        if fallback is not None:
            self.fallback = fallback

    @property
    def retry(self) -> bool:
        """Whether trying again (after ``retry_after`` seconds, if set) may succeed."""
        return self.retryable


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


class SchemaVersionUnsupported(MeshError, ValueError):
    """The receiver serves no contract of that major version for the topic; ``details`` has
    ``supported`` (the versions it serves), ``topic`` and ``version`` (what was sent)."""

    code = "SCHEMA_VERSION"


class Nack(MeshError):
    """A handler's explicit refusal, raised in the handler and received by the sender.

    ``raise Nack("busy", retry=True, retry_after=5)``: qos 1 is delivered again after that delay
    (within its attempts); ``raise Nack("not mine", retry=False, fallback="expert")``: qos 1 is a
    dead letter at once. A request or a qos-0 send gets ``Nack`` back with those hints."""

    code = "NACK"


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


class OutboxFull(MeshError):
    """The sending daemon's qos-1 outbox is at a bound (for that destination or in total):
    the message was not accepted; retry later (``retry_after``)."""

    code = "OUTBOX_FULL"
    retryable = True


class StorageFull(MeshError):
    """The sending daemon could not write a qos-1 message to its outbox (disk full or an I/O
    error): it was not stored and will not be sent; retry later (``retry_after``)."""

    code = "STORAGE_FULL"
    retryable = True


class PublicationsMissed(MeshError):
    """A gap notice: this subscriber's inbox was full and it missed publications.
    ``details`` has ``topic`` and ``missed`` (how many since the last notice)."""

    code = "PUBLICATIONS_MISSED"


class DaemonUnreachable(MeshError, ConnectionError):
    """The local meshd daemon did not answer on its agent socket."""

    code = "DAEMON_UNREACHABLE"
    retryable = True


class DaemonStopping(DaemonUnreachable):
    """The local daemon is stopping (a notice when its shutdown begins, or the answer to
    ``register`` while it stops): qos-0 sends are held and registered again with the next one."""

    code = "DAEMON_STOPPING"


class StartupError(MeshError, RuntimeError):
    """The daemon cannot start: no usable interface, the agent socket path taken or not a socket.

    ``step`` names the start-up step that failed (see ``meshd.daemon.node.START_STEPS``).
    """

    code = "STARTUP_ERROR"

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


class StateFileError(MeshError, RuntimeError):
    """A file in the state dir is unreadable or corrupt: the daemon cannot start until it is
    fixed. ``path`` names it, ``reason`` says what is wrong, ``fix`` what to do. Exit code 2."""

    code = "STATE_ERROR"

    def __init__(self, path: object, reason: str, fix: str) -> None:
        super().__init__(f"{path}: {reason} (fix: {fix})")
        self.path = str(path)
        self.reason = reason
        self.fix = fix


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
        SchemaVersionUnsupported,
        Nack,
        TooLarge,
        NotRegistered,
        DaemonUnreachable,
        DaemonStopping,
        Cancelled,
        Undeliverable,
        OutboxFull,
        StorageFull,
        PublicationsMissed,
    )
}


# -- tasks, plans and spawning ----------------------------------------------------------------------


class NoSuchTask(MeshError, LookupError):
    """No task (or plan) with that id in this daemon's task store."""

    code = "NO_SUCH_TASK"


class TaskFailed(MeshError):
    """A task ended failed or cancelled; ``message`` says why (its last error)."""

    code = "TASK_FAILED"


class TaskStoreFull(MeshError):
    """The task store holds ``tasks.max_stored_tasks`` unfinished tasks: finish or cancel some first."""

    code = "TASK_STORE_FULL"
    retryable = True


class NoSuchTemplate(MeshError, LookupError):
    """``spawn_agent`` named a template that is not in the config's ``[[spawn.templates]]``."""

    code = "NO_SUCH_TEMPLATE"


class SpawnQuota(MeshError):
    """A template's ``max_instances`` (or ``spawn.max_children``) children are already running."""

    code = "SPAWN_QUOTA"
    retryable = True


class SpawnFailed(MeshError):
    """The template's command could not be started (not found, not executable, bad cwd)."""

    code = "SPAWN_FAILED"


ERRORS_BY_CODE.update({cls.code: cls for cls in (NoSuchTask, TaskFailed, TaskStoreFull, NoSuchTemplate,
                                                 SpawnQuota, SpawnFailed)})
# -- syscall tools (block owned by the "tools" work; codes travel in agent error envelopes) ------


class NoSuchTool(MeshError, LookupError):
    """No tool of that name is registered on the daemon."""

    code = "NO_SUCH_TOOL"


class ApprovalDenied(MeshError, PermissionError):
    """A tool call with side effects was denied by the approval policy, a plugin or a person."""

    code = "APPROVAL_DENIED"


class Forbidden(MeshError, PermissionError):
    """The authorization hook refused: this agent may not call this tool (or message this agent)."""

    code = "FORBIDDEN"


class QuotaExceeded(MeshError):
    """A per-agent tool quota (calls per minute, concurrent tasks, spawned agents) is used up."""

    code = "QUOTA_EXCEEDED"
    retryable = True


class NotWired(MeshError):
    """The tool's primitive (task service, spawner) is not running on this daemon: nothing was done."""

    code = "NOT_WIRED"


class NoSuchApproval(MeshError, LookupError):
    """No held tool call has that approval id (decided already, timed out, or never held)."""

    code = "NO_SUCH_APPROVAL"


class QueueFull(MeshError):
    """A bounded table (held approvals) is at its configured limit: retry later."""

    code = "QUEUE_FULL"
    retryable = True


ERRORS_BY_CODE.update({cls.code: cls for cls in (
    NoSuchTool, ApprovalDenied, Forbidden, QuotaExceeded, NotWired, NoSuchApproval, QueueFull)})


def error_from_wire(wire: Any) -> MeshError:
    """Turn the ``error`` map of an error envelope into the matching typed exception."""
    if not isinstance(wire, dict):
        return MeshError(f"malformed error envelope: {wire!r}")
    code = str(wire.get("code", "ERROR"))
    cls = ERRORS_BY_CODE.get(code, MeshError)
    retry_after = wire.get("retry_after")
    retry = wire.get("retry")
    fallback = wire.get("fallback")
    err = cls(
        str(wire.get("message", code)),
        retry_after=float(retry_after) if isinstance(retry_after, (int, float))
        and not isinstance(retry_after, bool) else None,
        remote_type=str(wire["type"]) if wire.get("type") else None,
        retry=True if retry is True else None,  # a class retryable by default stays so
        fallback=fallback if isinstance(fallback, str) and fallback else None,
    )
    if cls is MeshError:
        err.code = code
    if "topic" in wire and "missed" in wire:  # a gap notice (PUBLICATIONS_MISSED)
        err.details = {"topic": wire["topic"], "missed": wire["missed"]}
    else:  # a contract's refusal names the field, the topic, the version, what is served
        err.details = {k: wire[k] for k in ("field", "topic", "version", "supported", "trace") if k in wire}
    return err
