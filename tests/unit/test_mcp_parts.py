"""The MCP binding's parts that need no daemon: the listen address, the token file,
the HTTP gate (Host, Origin, bearer token), the progress relay and the channel notification."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from meshd.bindings.mcp_http import BearerGate, parse_listen, read_or_make_token
from meshd.bindings.mcp_server import ProgressRelay, channel_params
from meshd.errors import ConfigError


@pytest.mark.parametrize(("text", "want"), [
    ("127.0.0.1:9000", ("127.0.0.1", 9000)),
    ("127.0.0.1", ("127.0.0.1", 8767)),
    (":0", ("127.0.0.1", 0)),
    ("[::1]:9000", ("::1", 9000)),
    ("localhost:9", ("localhost", 9)),
    ("192.168.1.5:8767", ("192.168.1.5", 8767)),
])
def test_listen_addresses(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["example.com:80", "127.0.0.1:port", "127.0.0.1:70000"])
def test_bad_listen_addresses_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--http"):
        parse_listen(text)


def test_token_file_is_made_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "mcp-x.token"
    token, made = read_or_make_token(path)
    assert made and len(token) >= 40 and path.stat().st_mode & 0o777 == 0o600
    assert read_or_make_token(path) == (token, False)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_or_make_token(path)


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.reached = False

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached = True

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


AUTH = "Bearer s3cret-token-0123456789"


@pytest.mark.parametrize(("headers", "status"), [
    ({"host": "127.0.0.1:9"}, 401),
    ({"host": "127.0.0.1:9", "authorization": "Bearer wrong"}, 401),
    ({"host": "evil.example:9", "authorization": AUTH}, 421),
    ({"host": "127.0.0.1:9", "origin": "http://evil.example", "authorization": AUTH}, 403),
    ({"host": "127.0.0.1:9", "origin": "http://127.0.0.1:9", "authorization": AUTH}, None),
    ({"host": "127.0.0.1:9", "authorization": AUTH}, None),
])
def test_http_gate(headers: dict[str, str], status: int | None) -> None:
    rec = _Recorder()
    gate = BearerGate(rec.app, "s3cret-token-0123456789", ["127.0.0.1:9"], ["http://127.0.0.1:9"])
    scope = {"type": "http", "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(gate(scope, None, rec.send))
    if status is None:
        assert rec.reached and not rec.sent and gate.refused == 0
    else:
        assert not rec.reached and rec.sent[0]["status"] == status and gate.refused == 1
        names = {k for k, _ in rec.sent[0]["headers"]}
        assert (b"www-authenticate" in names) == (status == 401)


def test_progress_relay_notes_and_keepalive_only_grow() -> None:
    reports: list[tuple[float, str | None]] = []
    enough = asyncio.Event()

    async def report(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, message))
        if len(reports) >= 3:
            enough.set()

    async def scenario() -> Any:
        relay = ProgressRelay(report, every=0.01)

        async def call() -> str:
            await relay.note("step 1")
            await enough.wait()  # the keep-alive went on while the call ran
            return "done"

        return await relay.run(call()), relay

    result, relay = asyncio.run(scenario())
    assert result == "done" and reports[0] == (1.0, "step 1")
    assert [p for p, _ in reports] == [float(i) for i in range(1, len(reports) + 1)]
    assert all(m is not None and m.startswith("step 1 (") for _, m in reports[1:])
    assert relay.sent == len(reports)


def test_progress_relay_survives_a_failing_report() -> None:
    async def report(progress: float, total: float | None, message: str | None) -> None:
        raise RuntimeError("the stream is gone")

    async def scenario() -> int:
        relay = ProgressRelay(report, every=60)
        await relay.note("x")
        return relay.sent

    assert asyncio.run(scenario()) == 0


def test_channel_notification_params() -> None:
    params = channel_params({"id": "m1", "from": "expert", "topic": "review", "kind": "request",
                             "is_request": True, "payload": {"doc": "d1"}})
    assert params["meta"] == {"id": "m1", "sender": "expert", "topic": "review", "kind": "request",
                              "is_request": "true"}
    assert "reply_message" in params["content"] and '"doc": "d1"' in params["content"]
    assert all(k.isidentifier() for k in params["meta"])
