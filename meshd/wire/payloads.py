"""Payload codec of the client: msgpack with pydantic models as dicts. Daemons never call this.

Owns: how an agent's payload becomes bytes and back, the typed error for one that cannot, and
the per-agent encoder (:func:`payload_encoder`, one reused msgpack ``Packer``).
Must not touch: headers, frames or sockets (payload bytes travel opaque through the daemons).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from meshd.errors import TooLarge, ValidationFailed

__all__ = ["PayloadEncoder", "decode_payload", "encode_payload", "payload_encoder"]


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


PayloadEncoder = Callable[[Any, int], bytes]
"""``encode(payload, limit)``: msgpack-encode a payload (pydantic models become dicts); raises
ValidationFailed, and TooLarge past ``limit`` bytes. Made by :func:`payload_encoder`."""


def payload_encoder() -> PayloadEncoder:
    """An encoder with one msgpack ``Packer`` of its own, reused: ``msgpack.packb`` builds a
    ``Packer`` (and allocates its 256 KiB buffer) per call, 0.3-0.9 us of a send that cost ~3 us
    in all (bench/send_path.py). Same bytes, same errors as :func:`encode_payload`. A closure, not
    a class with ``__call__`` (0.07 us less per call). One per ``Agent``: a ``Packer`` must not be
    shared between threads (``default`` runs Python code mid-pack). After an error the ``Packer``
    starts its next payload from an empty buffer (msgpack resets it)."""
    pack = msgpack.Packer(use_bin_type=True, default=_default).pack

    def encode(payload: Any, limit: int) -> bytes:
        try:
            data: bytes = pack(payload)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValidationFailed(f"payload is not msgpack-encodable: {exc}") from None
        if len(data) > limit:
            raise TooLarge(f"payload of {len(data)} bytes exceeds the limit of {limit}")
        return data

    return encode


def decode_payload(data: bytes) -> Any:
    """The payload a sending client encoded (None for an empty frame)."""
    if not data:
        return None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
