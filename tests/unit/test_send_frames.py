"""transport.send_frames and recv_frames: what ``send_multipart(frames, NOBLOCK)`` and
``recv_multipart(NOBLOCK)`` do, on real zmq sockets (inproc, nothing leaves the process): the
frames arrive as one multipart message, a full pipe refuses the whole message with zmq.Again, a
frame that is not a buffer is a TypeError, and an empty pipe is zmq.Again to the reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from meshd.transport import frame_sender, recv_frames, send_frames


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    ctx = zmq.Context()
    sender = ctx.socket(zmq.PAIR)
    receiver = ctx.socket(zmq.PAIR)
    for sock in (sender, receiver):
        sock.setsockopt(zmq.LINGER, 0)
    sender.setsockopt(zmq.SNDHWM, 2)
    receiver.setsockopt(zmq.RCVHWM, 2)
    receiver.bind("inproc://send-frames")
    sender.connect("inproc://send-frames")
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()
        ctx.term()


def test_frames_arrive_as_one_multipart_message(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    sender, receiver = pair
    send_frames(sender, [b"rid", b"\x01sig", b"header", b"x" * 300])
    send_frames(sender, [b"only"])
    assert receiver.recv_multipart() == [b"rid", b"\x01sig", b"header", b"x" * 300]
    assert receiver.recv_multipart() == [b"only"]


def test_a_full_pipe_refuses_the_whole_message(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    sender, receiver = pair
    sent = 0
    with pytest.raises(zmq.Again):
        for sent in range(100):  # inproc: SNDHWM + RCVHWM messages fit, then Again
            send_frames(sender, [b"a", b"b", str(sent).encode()])
    got = []
    while receiver.poll(0):
        got.append(receiver.recv_multipart())
    # Every message either arrived whole or not at all; the refused one left nothing behind.
    assert got == [[b"a", b"b", str(n).encode()] for n in range(sent)]
    assert sent >= 2


def test_a_frame_that_is_not_a_buffer_is_a_type_error(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    sender, _ = pair
    with pytest.raises(TypeError):
        send_frames(sender, ["text is not a frame"])


def test_frame_sender_uses_send_multipart_of_what_is_not_a_zmq_socket() -> None:
    class StandIn:
        def __init__(self) -> None:
            self.calls: list[tuple[list[bytes], int]] = []

        def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
            self.calls.append((frames, flags))

    stand_in = StandIn()
    frame_sender(stand_in)([b"a", b"b"])
    assert stand_in.calls == [([b"a", b"b"], zmq.NOBLOCK)]


def test_recv_frames_reads_one_whole_message_at_a_time(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    sender, receiver = pair
    with pytest.raises(zmq.Again):
        recv_frames(receiver)
    sender.send_multipart([b"rid", b"", b"header", b"x" * 5000])
    sender.send_multipart([b"one"])
    assert receiver.poll(1000)
    assert recv_frames(receiver) == [b"rid", b"", b"header", b"x" * 5000]
    assert recv_frames(receiver) == [b"one"]
    with pytest.raises(zmq.Again):
        recv_frames(receiver)
