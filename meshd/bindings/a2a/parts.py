"""Mesh payloads and errors in A2A's terms: message parts in, an artifact out, an error as a state.

Owns the conversions both directions use (an exposed mesh agent and a remote A2A agent) and the
table of docs/a2a.md, "Errors": which meshd error code ends a task in which A2A state. Payloads stay
plain data (what msgpack carries); nothing here touches the mesh or the network.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final

from a2a.types import Part, TaskState
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

__all__ = [
    "ERROR_STATES",
    "INTERRUPTED",
    "error_parts",
    "parts_from_payload",
    "payload_from_parts",
    "state_for_error",
    "state_name",
]

#: meshd error code -> the state the A2A task ends in (docs/a2a.md, "Errors"). Codes not listed
#: end the task FAILED; every one carries a DataPart ``{code, message, retry, retry_after}``.
ERROR_STATES: Final[dict[str, TaskState]] = {
    "NO_SUCH_AGENT": TaskState.TASK_STATE_REJECTED,
    "VALIDATION_FAILED": TaskState.TASK_STATE_REJECTED,
    "TOO_LARGE": TaskState.TASK_STATE_REJECTED,
    "FORBIDDEN": TaskState.TASK_STATE_REJECTED,
    "APPROVAL_DENIED": TaskState.TASK_STATE_REJECTED,
    "NO_SUCH_TOOL": TaskState.TASK_STATE_REJECTED,
    "CANCELLED": TaskState.TASK_STATE_CANCELED,
    "TIMEOUT": TaskState.TASK_STATE_FAILED,
    "HANDLER_ERROR": TaskState.TASK_STATE_FAILED,
    "INBOX_FULL": TaskState.TASK_STATE_FAILED,
    "PEER_UNREACHABLE": TaskState.TASK_STATE_FAILED,
    "HOP_LIMIT": TaskState.TASK_STATE_FAILED,
    "UNDELIVERABLE": TaskState.TASK_STATE_FAILED,
    "QUEUE_FULL": TaskState.TASK_STATE_FAILED,
    "DAEMON_UNREACHABLE": TaskState.TASK_STATE_FAILED,
    "TASK_FAILED": TaskState.TASK_STATE_FAILED,
    "QUOTA_EXCEEDED": TaskState.TASK_STATE_FAILED,
    "TASK_STORE_FULL": TaskState.TASK_STATE_FAILED,
}
#: States in which a remote A2A agent waits for its requester (answered to the mesh as data).
INTERRUPTED: Final = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})


def state_for_error(code: str) -> TaskState:
    return ERROR_STATES.get(code, TaskState.TASK_STATE_FAILED)


def state_name(state: TaskState) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` -> ``input-required`` (the form meshd answers use)."""
    return str(TaskState.Name(state)).removeprefix("TASK_STATE_").lower().replace("_", "-")


def _jsonable(value: Any) -> Any:
    """What a protobuf ``Value`` can hold: bytes become base64 text, other odd types their str."""
    def default(obj: Any) -> Any:
        if isinstance(obj, bytes | bytearray | memoryview):
            return base64.b64encode(bytes(obj)).decode("ascii")
        return str(obj)
    return json.loads(json.dumps(value, default=default))


def _whole(value: Any) -> Any:
    """A protobuf ``Value`` keeps numbers as doubles: whole ones come back as ints."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


def _one(part: Part) -> dict[str, Any]:
    if part.HasField("text"):
        out: dict[str, Any] = {"text": part.text}
    elif part.HasField("data"):
        out = {"data": _whole(MessageToDict(part.data))}
    elif part.HasField("raw"):
        out = {"raw": bytes(part.raw)}
    elif part.HasField("url"):
        out = {"url": part.url}
    else:
        out = {}
    if part.media_type:
        out["media_type"] = part.media_type
    if part.filename:
        out["filename"] = part.filename
    return out


def payload_from_parts(parts: Any) -> Any:
    """A message's parts as a mesh payload: one text part is its string, one data part its
    value, one raw part (without a filename) its bytes; anything else is the list of parts as maps
    (``{"text"|"data"|"raw"|"url": ..., "media_type", "filename"}``)."""
    items = list(parts)
    if len(items) == 1:  # its media type says how it was encoded, and goes (a filename stays)
        only = items[0]
        if only.HasField("text"):
            return only.text
        if only.HasField("data"):
            return _whole(MessageToDict(only.data))
        if only.HasField("raw") and not only.filename:
            return bytes(only.raw)
    return [_one(p) for p in items]


def parts_from_payload(payload: Any) -> list[Part]:
    """A mesh answer as parts: a string is a text part, bytes a raw part, anything else (None
    included) one data part with its JSON form."""
    if isinstance(payload, str):
        return [Part(text=payload)]
    if isinstance(payload, bytes | bytearray):
        return [Part(raw=bytes(payload), media_type="application/octet-stream")]
    return [Part(data=ParseDict(_jsonable(payload), struct_pb2.Value()), media_type="application/json")]


def error_parts(code: str, message: str, *, retry: bool = False,
                retry_after: float | None = None) -> list[Part]:
    """An error as a task status message carries it: the text, and the typed fields as data."""
    data = {"code": code, "message": message, "retry": retry, "retry_after": retry_after}
    return [Part(text=f"{code}: {message}"),
            Part(data=ParseDict(data, struct_pb2.Value()), media_type="application/json")]
