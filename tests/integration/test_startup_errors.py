"""A start that cannot finish raises a typed StartupError and releases what it bound."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshd.config.settings import Settings
from meshd.daemon.node import Node
from meshd.errors import StartupError


@pytest.fixture
def short() -> Iterator[Path]:
    """A short directory: ipc socket paths are limited to 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="mshd-", dir="/tmp") as d:
        yield Path(d)


def _settings(state: Path, sock: Path) -> Settings:
    return Settings(state_dir=state, socket=sock, insecure=True, interfaces=["127.0.0.1"],
                    discovery=False, mesh=f"t{uuid.uuid4().hex[:10]}")


def test_agent_socket_path_taken_by_a_file(tmp_path: Path, short: Path) -> None:
    sock = short / "s.sock"
    sock.write_text("not a socket")
    node = Node(_settings(tmp_path / "state", sock))
    with pytest.raises(StartupError) as info:
        asyncio.run(node.serve(asyncio.Event()))
    assert info.value.step == "sockets" and "not a socket" in str(info.value)
    assert isinstance(info.value, RuntimeError)  # callers catching RuntimeError still do
    assert sock.read_text() == "not a socket"  # never removed: it is not ours


def test_agent_socket_served_by_another_process(tmp_path: Path, short: Path) -> None:
    path = short / "s.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen(1)
    try:
        node = Node(_settings(tmp_path / "state", path))
        with pytest.raises(StartupError, match="another meshd is serving"):
            asyncio.run(node.serve(asyncio.Event()))
        assert path.exists()  # the other daemon's socket is left alone
    finally:
        other.close()
