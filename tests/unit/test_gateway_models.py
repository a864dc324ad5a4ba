"""The gateway's models, the document built from them, and the answer check (no sockets).

The routes served are the routes documented; a request that does not fit its model is a typed
error naming the field; an answer of the wrong shape is caught by the check that
``http_check_responses`` runs on every answer (a wrong shape injected here).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from meshd.errors import ValidationFailed
from meshd.gateway import models as M
from meshd.gateway.app import Routes, build_app, check_response, served_routes
from meshd.gateway.errors import BadRequest
from meshd.gateway.openapi import ROUTES, openapi_spec


def _app(check: bool = False) -> web.Application:
    return _built(check)[0]


def _built(check: bool) -> tuple[web.Application, Routes]:
    gateway: Any = SimpleNamespace(settings=SimpleNamespace(http_check_responses=check,
                                                            http_max_body_bytes=4096))
    return build_app(gateway)


def test_the_routes_served_are_the_routes_documented() -> None:
    assert served_routes(_app()) == {(r.method, r.path) for r in ROUTES}
    spec = openapi_spec("http://127.0.0.1:1/")
    assert {(m, p) for p, ops in spec["paths"].items() for m in ops} == {(r.method, r.path) for r in ROUTES}
    json.dumps(spec)  # plain JSON all the way down


def test_content_types_and_error_bodies_are_documented() -> None:
    paths = openapi_spec("http://x/")["paths"]
    assert set(paths["/"]["get"]["responses"]["200"]["content"]) == {"text/html"}
    for path in ("/v1/agents/{session_id}/events", "/v1/dashboard/events"):
        content = paths[path]["get"]["responses"]["200"]["content"]
        assert set(content) == {"text/event-stream"}
        assert content["text/event-stream"]["schema"]["oneOf"]  # each event's data has its model
    for path, ops in paths.items():
        for method, op in ops.items():
            for status, answer in op["responses"].items():
                if (status.startswith(("4", "5")) and status != "401") or status == "default":
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
    agents = paths["/v1/agents"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert agents == {"$ref": "#/components/schemas/AgentsList"}
    doc = openapi_spec("http://x/")["components"]["schemas"]
    assert doc["AgentsList"]["type"] == "array"
    # required fields are not nullable: {"name": null} is refused by the document and the gateway
    register = doc["RegisterRequest"]
    assert register["required"] == ["name"] and register["properties"]["name"]["type"] == "string"


def test_a_bad_field_is_named() -> None:
    with pytest.raises(BadRequest) as err:
        M.parse_body(M.RegisterRequest, b'{"name": null}')
    assert err.value.details == {"field": "name"} and "'name'" in err.value.message
    with pytest.raises(ValidationFailed):
        M.parse_body(M.RegisterRequest, b'{"name": "has space"}')
    with pytest.raises(BadRequest) as err:
        M.parse_body(M.MessageRequest, b'{"sender_session": "s1", "target": "t", "prompt": "p", "qos": true}')
    assert err.value.details == {"field": "qos"}
    with pytest.raises(BadRequest) as err:
        M.parse_body(M.MessageRequest, b'{"target": "t", "prompt": "p"}')
    assert err.value.details == {"field": "sender_session"}
    with pytest.raises(BadRequest, match="malformed JSON"):
        M.parse_body(M.RegisterRequest, b'{"name":')
    ok = M.parse_body(M.HeartbeatRequest, b'{"queue_depth": 3.0, "unknown": 1}')  # 3.0 is an integer
    assert ok.queue_depth == 3
    with pytest.raises(BadRequest, match="malformed JSON"):
        M.parse_body(M.RequestRequest, b'{"session_id": "s", "target": "t", "payload": NaN}')
    big = M.parse_body(M.RequestRequest, b'{"session_id": "s", "target": "t", "payload": [%d, 7]}' % 2**70)
    assert big.payload == [float(2**70), 7]  # past 64 bits a JSON integer is read as JavaScript does
    with pytest.raises(BadRequest) as err:
        M.parse_body(M.HeartbeatRequest, b'{"queue_depth": %d}' % 2**70)
    assert err.value.details == {"field": "queue_depth"}


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


NODE = {"node": "n1", "name": "a", "mesh": "m", "routers": [], "pubs": [], "socket": "/s", "insecure": True,
        "uptime": 1.0, "agents": 0, "peers": 0, "stats": {}, "dead_letters": 0,
        "gateway": {"sessions": 0, "streams": 0, "slow_disconnects": 0, "closed_streams": 0,
                    "auth_refused": 0, "bad_requests": 0, "checked_responses": 0, "invalid_responses": 0}}


def test_the_answer_check_catches_a_wrong_shape() -> None:
    assert check_response("GET", "/v1/node", _json(NODE)) is None
    assert check_response("GET", "/v1/node", _json([NODE])) is not None  # an array where an object is
    missing = {k: v for k, v in NODE.items() if k != "gateway"}
    assert "gateway" in str(check_response("GET", "/v1/node", _json(missing)))
    assert check_response("GET", "/v1/agents", _json([{"name": "x", "node": "n"}])) is None
    assert check_response("GET", "/v1/agents", _json({"agents": []})) is not None
    assert check_response("POST", "/v1/publish", _json({"subscribers": 1, "extra": 2})) is not None
    accepted = _json({"msg_id": "m", "expects_response": True}, 202)
    assert check_response("POST", "/v1/messages", accepted) is None
    # error bodies: the one shape
    assert check_response("GET", "/v1/node", _json({"error": {"code": "X", "message": "m"}}, 404)) is None
    assert check_response("GET", "/v1/node", _json({"code": "X"}, 404)) is not None
    text = web.Response(text="{}", content_type="text/plain")
    assert "content type" in str(check_response("GET", "/v1/node", text))
    assert check_response("GET", "/", web.Response(text="<html>", content_type="text/html")) is None


def test_the_middleware_answers_500_for_a_wrong_shape() -> None:
    """``http_check_responses``: a handler that answers an array where the document says object
    is turned into 500 RESPONSE_INVALID (and counted); a right answer passes untouched."""
    app, routes = _built(check=True)
    assert app.middlewares[0] == routes.check_responses

    async def go() -> tuple[web.StreamResponse, web.StreamResponse]:
        request = make_mocked_request("GET", "/v1/node", app=app)
        request._match_info = await app.router.resolve(request)  # what the server does first

        async def wrong(_request: web.Request) -> web.StreamResponse:
            return web.json_response([NODE])

        async def right(_request: web.Request) -> web.StreamResponse:
            return web.json_response(NODE)

        return await routes.check_responses(request, wrong), await routes.check_responses(request, right)

    bad, good = asyncio.run(go())
    assert isinstance(bad, web.Response) and bad.status == 500 and isinstance(bad.body, bytes)
    assert json.loads(bad.body)["error"]["code"] == "RESPONSE_INVALID"
    assert good.status == 200
    assert routes.invalid_responses == 1 and routes.checked_responses == 2
