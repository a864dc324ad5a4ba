"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

InprocPair = Callable[[bytes], tuple[zmq.Socket[Any], zmq.Socket[Any]]]


@pytest.fixture
def inproc_pair() -> Iterator[InprocPair]:
    """A real ROUTER -> DEALER pair over inproc standing for the agent socket and one agent
    connection (its routing id given), high-water marks of 2 so an inbox fills at once; the
    ROUTER has learnt the routing id. Closed after the test."""
    ctx: zmq.Context[Any] = zmq.Context()

    def make(rid: bytes) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, 2)
        router.bind(f"inproc://pair-{rid.hex()}")
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.ROUTING_ID, rid)
        dealer.setsockopt(zmq.RCVHWM, 2)
        dealer.connect(f"inproc://pair-{rid.hex()}")
        dealer.send_multipart([b"hello"])  # the ROUTER learns the routing id
        assert router.recv_multipart() == [rid, b"hello"]
        return router, dealer

    yield make
    ctx.destroy(0)
