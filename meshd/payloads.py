"""Payload codec of the client: msgpack with pydantic models as dicts. Daemons never call this.

Owns: how an agent's payload becomes bytes and back, and the typed error for one that cannot.
Must not touch: headers, frames or sockets (payload bytes travel opaque through the daemons).
"""

from __future__ import annotations

from typing import Any

import msgpack

from .errors import ValidationFailed

__all__ = ["decode_payload", "encode_payload"]


def _default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):  # pydantic models travel as plain dicts
        return dump(mode="json")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as msgpack")


def encode_payload(payload: Any) -> bytes:
    """msgpack-encode a payload; pydantic models become dicts. Raises ValidationFailed."""
    try:
        return msgpack.packb(payload, use_bin_type=True, default=_default)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationFailed(f"payload is not msgpack-encodable: {exc}") from None


def decode_payload(data: bytes) -> Any:
    """The payload a sending client encoded (None for an empty frame)."""
    if not data:
        return None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
