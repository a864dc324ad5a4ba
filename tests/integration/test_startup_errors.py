"""A start that cannot finish raises a typed StartupError and releases what it bound."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
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


def test_an_address_this_host_does_not_have_is_a_config_error_exit_2(tmp_path: Path, short: Path) -> None:
    """Restarting cannot give the host an address, so `meshd run` exits 2 (systemd does not loop)
    and names the key, as for every other error a restart cannot fix."""
    done = subprocess.run([sys.executable, "-m", "meshd", "run", "--interface", "192.0.2.77", "--insecure",
                           "--allow-insecure-lan", "--no-discovery", "--no-http",
                           "--state-dir", str(tmp_path / "st"), "--socket", str(short / "s.sock")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "config error: interfaces: 192.0.2.77" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (short / "s.sock").exists()
