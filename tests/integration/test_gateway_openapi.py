"""The gateway's OpenAPI document is the truth, checked by schemathesis against a real daemon.

schemathesis (the standard's own fuzzer, run through its Python engine as ``st run`` would) reads
``/v1/openapi.json`` from a real gateway and sends what it generates from it, schema-valid and not,
with a registered session so the calls reach the real logic: every answer must fit the document
(status, content type, body, ``Allow`` on 405), every schema-valid request be accepted and every
invalid one refused. The daemon runs with ``http_check_responses``, so it also checks its own
answers against the models. Beside it: 405s list only the methods served, a NUL byte in a header is
a plain 400 and one log line (no traceback), and the routes served are the routes documented.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import urllib.request
from typing import Any

import aiohttp
import pytest

from meshd import Agent
from meshd.gateway.openapi import ROUTES
from meshd.testing import MeshdFactory, MeshdProcess

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis (the test extra) fuzzes the OpenAPI")

MAX_EXAMPLES = 12  # per operation and phase: the whole run stays well under a minute on 2 cores


def _post(proc: MeshdProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    gw = proc.gateway()
    req = urllib.request.Request(gw.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {gw.token}"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return dict(json.loads(resp.read()))


def _failures(events: list[Any]) -> list[str]:
    from schemathesis.engine import Status
    from schemathesis.engine import events as ev

    out = []
    for event in events:
        if isinstance(event, ev.ScenarioFinished) and event.status in (Status.FAILURE, Status.ERROR):
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failure = check.failure_info.failure
                        case = event.recorder.cases[case_id].value
                        seen = event.recorder.interactions.get(case_id)
                        answer = seen.response.content[:300] if seen is not None and seen.response else b""
                        out.append(f"{event.label}: {check.name}: {failure.title}: {failure.message} "
                                   f"[{check.failure_info.code_sample}] body={case.body!r} answer={answer!r}")
            if event.status == Status.ERROR:
                out.append(f"{event.label}: error in the run")
        elif isinstance(event, ev.NonFatalError | ev.FatalError):
            out.append(f"schemathesis error: {event.info.format() if hasattr(event, 'info') else event}")
    return out


def _config(token: str, sid: str) -> Any:
    """What ``st run`` would read from schemathesis.toml, for this gateway and session."""
    return schemathesis.Config.from_dict({
        "headers": {"Authorization": f"Bearer {token}"},
        "seed": 22,
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
        "request-timeout": 10,
        "max-stream-events": 1,
        "warnings": False,
        # The registered session everywhere a session id goes, so calls reach the real logic.
        "parameters": {"session_id": sid, "body.session_id": sid, "body.sender_session": sid},
        "operations": [
            {"include-path": "/v1/token/rotate", "enabled": False},  # would lock the fuzzer out
            # not the fuzzed session: it must live on; a session never registered: a 404
            {"include-name": "DELETE /v1/agents/{session_id}",
             "parameters": {"session_id": "never-registered"}},
            # a new session each time: past http_max_sessions (429), never replacing the fuzzed one
            {"include-name": "POST /v1/agents/register", "parameters": {"body.session_id": "new-session"}},
            # calls that wait for an answer go to the echo agent (where the fuzzer lets a value be set)
            *({"include-name": f"POST {path}", "parameters": {"body.target": "echo"}}
              for path in ("/v1/request", "/v1/handoff", "/v1/messages")),
            # the SSE streams: one event, or a second of silence, and the stream is closed
            *({"include-name": f"GET {path}", "request-timeout": 1, "generation": {"max-examples": 3}}
              for path in ("/v1/agents/{session_id}/events", "/v1/dashboard/events")),
        ],
    })


def test_schemathesis_finds_nothing(meshd_factory: MeshdFactory) -> None:
    # One session at most: the fuzzer's registrations reach the checks and the bound (429), and no
    # agent with a generated name ever exists (a request to an HTTP agent that never answers would
    # wait out its timeout).
    # Default liveness timings (offline after 10 s): a busy host cannot make the session go offline.
    a = meshd_factory.spawn("a", fast=False,
                            env={"MESHD_HTTP_CHECK_RESPONSES": "true", "MESHD_HTTP_MAX_SESSIONS": "1"})
    gw = a.gateway()
    sid = _post(a, "v1/agents/register", {"name": "fuzzed", "model": "schemathesis"})["session_id"]
    from schemathesis.engine import events as ev

    def fuzz() -> list[Any]:
        schema = schemathesis.openapi.from_url(gw.url + "v1/openapi.json", config=_config(gw.token, sid),
                                               headers={"Authorization": f"Bearer {gw.token}"}, timeout=20)
        return list(schemathesis.engine.from_schema(schema).execute())

    async def scenario() -> list[Any]:
        async with Agent("echo", socket=a.socket) as echo, aiohttp.ClientSession() as http:
            echo.on("*")(lambda msg: {"echo": msg.topic})  # answers every request at once
            done = asyncio.Event()

            async def beat() -> None:  # the fuzzed session's client beats, as any does
                while not done.is_set():
                    async with http.post(f"{gw.url}v1/agents/{sid}/heartbeat", json={"queue_depth": 0},
                                         headers={"Authorization": f"Bearer {gw.token}"}) as r:
                        assert r.status == 200
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), 0.3)

            beats = asyncio.create_task(beat())
            try:
                return await asyncio.to_thread(fuzz)
            finally:
                done.set()
                await beats

    events = asyncio.run(scenario())
    tested = sum(len(e.recorder.cases) for e in events if isinstance(e, ev.ScenarioFinished))
    assert tested > 200, f"only {tested} cases ran"
    failures = _failures(events)
    assert not failures, "\n".join(failures)
    counters = json.loads(urllib.request.urlopen(urllib.request.Request(
        gw.url + "v1/node", headers={"Authorization": f"Bearer {gw.token}"}), timeout=20).read())["gateway"]
    assert counters["checked_responses"] > 200 and counters["invalid_responses"] == 0  # the daemon checked
    log = a.log()
    assert "Traceback" not in log and "does not fit the OpenAPI document" not in log
    assert a.alive()


def _answer(url: str, method: str, path: str, token: str) -> tuple[int, str, Any]:
    async def go() -> tuple[int, str, Any]:
        async with aiohttp.ClientSession() as s, s.request(
                method, url + path.lstrip("/"), headers={"Authorization": f"Bearer {token}"}) as r:
            return r.status, r.headers.get("Allow", ""), await r.json()
    return asyncio.run(go())


def _status_and_allow(url: str, method: str, path: str, token: str) -> tuple[int, str]:
    return _answer(url, method, path, token)[:2]


def test_405_allows_only_the_methods_served(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    gw = a.gateway()
    documented: dict[str, set[str]] = {}
    for route in ROUTES:
        documented.setdefault(route.path, set()).add(route.method.upper())
    concrete = {"{session_id}": "abc", "{msg_id}": "m1", "{name}": "list_agents", "{agent}": "nobody"}
    for path, methods in documented.items():
        real = path
        for k, v in concrete.items():
            real = real.replace(k, v)
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            if method in methods:
                continue
            status, allow, body = _answer(gw.url, method, real, gw.token)
            assert status == 405, (method, path, status)
            served = {m.strip() for m in allow.split(",") if m.strip()} - {"HEAD", "OPTIONS"}
            assert served == methods, (method, path, allow)
            assert body["error"]["code"] == "METHOD_NOT_ALLOWED", body
    # the fixed segments beside /v1/agents/{session_id} are not session ids
    assert _status_and_allow(gw.url, "DELETE", "/v1/agents/register", gw.token) == (405, "POST")
    assert _status_and_allow(gw.url, "GET", "/v1/agents/heartbeat", gw.token) == (405, "POST")
    status, _allow, body = _answer(gw.url, "GET", "/v1/nothing-here", gw.token)
    assert status == 404 and body["error"]["code"] == "NOT_FOUND"


def test_nul_byte_in_a_header_is_a_clean_400(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    gw = a.gateway()
    host, port = gw.url.split("//")[1].rstrip("/").rsplit(":", 1)

    def raw(extra: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            lines = [b"GET /v1/node HTTP/1.1", b"Host: x", b"Authorization: Bearer " + gw.token.encode(),
                     *([extra] if extra else []), b"Connection: close"]
            sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

    for _ in range(3):  # repeated: one log line in all
        answer = raw(b"X-Probe: a\x00b")
        assert answer.split(b" ", 2)[1] == b"400", answer[:200]  # aiohttp answers it as HTTP/1.0
    assert raw(b"X-Probe: fine").split(b" ", 2)[1] == b"200"  # the gateway goes on serving
    status_body = json.loads(raw(b"").split(b"\r\n\r\n", 1)[1])
    assert status_body["gateway"]["bad_requests"] == 3
    log = a.log()
    assert "Traceback" not in log
    assert log.count("refused an HTTP request that does not parse (400)") == 1
    assert "Invalid header value char" in log
