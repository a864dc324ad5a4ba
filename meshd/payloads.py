"""Payload codec of the client: msgpack with pydantic models as dicts. Daemons never call this.

Owns: how an agent's payload becomes bytes and back, the typed error for one that cannot, and
the per-agent encoder (:class:`PayloadEncoder`, one reused msgpack ``Packer``).
Must not touch: headers, frames or sockets (payload bytes travel opaque through the daemons).
"""

from __future__ import annotations

from typing import Any

import msgpack

from .errors import TooLarge, ValidationFailed

__all__ = ["PayloadEncoder", "decode_payload", "encode_payload"]


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


class PayloadEncoder:
    """``encode_payload`` with one msgpack ``Packer`` kept and reused: ``msgpack.packb`` builds a
    ``Packer`` (and allocates its 256 KiB buffer) per call, 0.3-0.9 us of a send that costs ~3 us
    in all (bench/send_path.py). Same bytes, same errors. One per ``Agent``: a ``Packer`` must not
    be shared between threads (``default`` runs Python code mid-pack). After an error the
    ``Packer`` starts its next payload from an empty buffer (msgpack resets it)."""

    __slots__ = ("_pack",)

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True, default=_default).pack

    def __call__(self, payload: Any, limit: int) -> bytes:
        """msgpack-encode a payload; pydantic models become dicts. Raises ValidationFailed, and
        TooLarge past ``limit`` bytes."""
        try:
            data: bytes = self._pack(payload)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValidationFailed(f"payload is not msgpack-encodable: {exc}") from None
        if len(data) > limit:
            raise TooLarge(f"payload of {len(data)} bytes exceeds the limit of {limit}")
        return data


def decode_payload(data: bytes) -> Any:
    """The payload a sending client encoded (None for an empty frame)."""
    if not data:
        return None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
