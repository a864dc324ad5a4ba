"""Fixtures shared by the unit tests, and their rule: no network socket (zmq inproc only).

Unit tests run in seconds and in parallel with anything: a test that binds or connects an IP
socket (a real daemon, an HTTP server) belongs in tests/integration. The guard below fails such a
test at its first bind or connect (a ZeroMQ tcp:// endpoint is refused by ``_no_zmq_tcp``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

_IP = (socket.AF_INET, socket.AF_INET6)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(original: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(self: socket.socket, *args: Any) -> Any:
            if self.family in _IP:
                raise AssertionError("a unit test opened a network socket: move it to tests/integration")
            return original(self, *args)
        return guarded

    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse(getattr(socket.socket, name)))
    for name in ("bind", "connect"):
        original = getattr(zmq.Socket, name)

        def guarded_zmq(self: zmq.Socket[Any], addr: str, _original: Any = original) -> Any:
            if not str(addr).startswith("inproc://"):
                raise AssertionError(f"a unit test used {addr}: move it to tests/integration")
            return _original(self, addr)
        monkeypatch.setattr(zmq.Socket, name, guarded_zmq)

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
