"""The client's side of the embedded node, as Protocols of its own (meshd/client/agent.py): the
client imports no daemon part, not even for typing, and the real in-process connection is what
``Agent.connect`` asks of it. mypy checks ``EmbeddedNode`` against ``EmbeddedLink`` where
meshd/daemon/embedded.py builds ``Agent(name, embedded=self)``. No sockets."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from meshd.client.agent import Agent, FrameHandler, InProcessLink
from meshd.daemon.embedded import AgentSockets

CLIENT = Path(__file__).resolve().parents[2] / "meshd" / "client"
DAEMON_SIDE = ("meshd.daemon", "meshd.mesh", "meshd.delivery", "meshd.qos1", "meshd.plugins",
               "meshd.discovery", "meshd.config", "meshd.cli", "meshd.hookspecs")


def imported(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (TYPE_CHECKING blocks and functions included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("module", sorted(p.name for p in CLIENT.glob("*.py")))
def test_no_client_module_imports_a_daemon_part_even_for_typing(module: str) -> None:
    bad = [name for name in imported(CLIENT / module)
           if any(name == side or name.startswith(side + ".") for side in DAEMON_SIDE)]
    assert bad == [], f"meshd/client/{module} imports {bad}"


class RecordingRouter:
    closed = False

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        pass


def test_the_real_in_process_connection_is_an_in_process_link() -> None:
    async def run() -> None:
        sockets = AgentSockets(RecordingRouter(), capacity=4,  # type: ignore[arg-type]
                               loop=asyncio.get_running_loop())
        conn = sockets.attach(lambda frames: None)
        assert isinstance(conn, InProcessLink)
        conn.close()
    asyncio.run(run())


class SocketOnly:
    """A node whose ``attach`` returns something that only sends: not an in-process link."""

    socket_path = Path("/nonexistent/links-test.sock")

    def attach(self, on_frames: FrameHandler) -> Any:
        class Sink:
            def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
                pass

            def close(self, linger: int | None = None) -> None:
                pass
        return Sink()


def test_connect_refuses_a_node_whose_attach_is_no_in_process_link() -> None:
    async def run() -> None:
        me = Agent("links", embedded=SocketOnly())
        assert me.socket_path == SocketOnly.socket_path
        with pytest.raises(TypeError, match="not an in-process link"):
            await me.connect()
    asyncio.run(run())
