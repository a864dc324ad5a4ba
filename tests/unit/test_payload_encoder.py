"""The client's payload encoder (meshd/wire/payloads.py): one reused msgpack Packer per agent, the same
bytes as ``encode_payload``, typed errors that leave nothing behind for the next payload."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from pydantic import BaseModel

from meshd.errors import TooLarge, ValidationFailed
from meshd.wire.payloads import decode_payload, encode_payload, payload_encoder

LIMIT = 1024


class Point(BaseModel):
    x: int
    y: int


@pytest.mark.parametrize("payload", [None, 1, "text", b"bytes", {"id": "a1", "seq": 7, "body": "x" * 252},
                                     [1, 2, {"k": {"n": None}}], Point(x=1, y=2), {"tags": {"a"}}, (1, 2)])
def test_same_bytes_as_encode_payload(payload: Any) -> None:
    encode = payload_encoder()
    assert encode(payload, LIMIT) == encode_payload(payload)
    assert encode(payload, LIMIT) == encode_payload(payload)  # and again, from the reused Packer


def test_an_unencodable_payload_is_refused_typed_and_the_next_one_is_whole() -> None:
    encode = payload_encoder()
    with pytest.raises(ValidationFailed, match="not msgpack-encodable"):
        encode({"ok": 1, "bad": object()}, LIMIT)  # fails half-way through the map
    with pytest.raises(ValidationFailed):
        encode(2**70, LIMIT)
    data = encode({"after": "error"}, LIMIT)
    assert decode_payload(data) == {"after": "error"}  # nothing of the failed ones leaked in
    assert data == msgpack.packb({"after": "error"}, use_bin_type=True)


def test_past_the_limit_is_too_large_and_the_next_one_is_whole() -> None:
    encode = payload_encoder()
    with pytest.raises(TooLarge, match=f"exceeds the limit of {LIMIT}"):
        encode("x" * LIMIT, LIMIT)
    assert len(encode("x" * (LIMIT - 3), LIMIT)) == LIMIT  # str8/16 header: 3 bytes, at the limit
    assert decode_payload(encode({"n": 1}, LIMIT)) == {"n": 1}
