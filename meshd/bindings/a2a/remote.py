"""External A2A agents as mesh agents: one mesh agent per configured Agent Card.

Owns the trust rule (a card from a host in ``a2a.trusted_hosts``, only its interfaces on such
hosts used; or a card signed by a key of ``a2a.card_keys``, trusted whole), the card's size
bound, the registration (the card's skills become capabilities), joining late when the remote is
down at start, and the request path: a mesh request becomes ``SendMessage`` (streaming when the
card says so) with the requester's time left (a mesh ``send`` too, its outcome only logged);
``WORKING`` status updates become ``progress`` notes; a completed task's artifacts become the
reply; ``INPUT_REQUIRED`` / ``AUTH_REQUIRED`` become a typed answer the requester can continue from
(docs/a2a.md, "External agents"); a failed, rejected or cancelled task an error; a mesh cancel
becomes ``CancelTask``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
from a2a.client import A2AClientError, A2AClientTimeoutError, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.types import AgentCard, CancelTaskRequest, Message, Role, SendMessageRequest, TaskState
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from meshd.bindings.a2a.parts import INTERRUPTED, parts_from_payload, payload_from_parts, state_name
from meshd.client import DEFER, Agent
from meshd.client import Message as MeshMessage
from meshd.client.handlers import ANY_TOPIC
from meshd.client.tracing import current_headers, trace_headers
from meshd.config.sections import RemoteA2aAgent
from meshd.errors import ERRORS_BY_CODE, ConfigError, MeshError

__all__ = ["MAX_CARD_BYTES", "RemoteAgent", "host_trusted", "mesh_name"]

log = logging.getLogger("meshd.a2a")

MAX_CARD_BYTES: Final = 256 * 1024
MAX_CAPABILITIES: Final = 64
CANCEL_GRACE: Final = 10.0
"""Seconds a cancelled request's reader waits to learn the remote task's id (to cancel it)."""
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_TERMINAL: Final = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                              TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED})
_ERROR_CODES: Final = {TaskState.TASK_STATE_FAILED: "HANDLER_ERROR",
                       TaskState.TASK_STATE_REJECTED: "FORBIDDEN",
                       TaskState.TASK_STATE_CANCELED: "CANCELLED"}


def host_trusted(url: str, trusted: list[str]) -> bool:
    """Whether ``url``'s host (or host:port) is one of ``trusted``."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host or parts.scheme not in _DEFAULT_PORTS:
        return False
    shown = f"[{host}]" if ":" in host else host
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    return shown in trusted or host in trusted or f"{shown}:{port}" in trusted


def mesh_name(text: str) -> str:
    """A card's name as a mesh agent name: letters, digits, ``. _ ~ -`` kept, the rest ``-``."""
    name = re.sub(r"[^A-Za-z0-9._~-]+", "-", text).strip("-")[:128]
    return name or "a2a-agent"


def _text_of(message: Message) -> str:
    return "\n".join(p.text for p in message.parts if p.HasField("text"))


async def fetch_card(http: httpx.AsyncClient, url: str) -> AgentCard:
    """GET a card, at most :data:`MAX_CARD_BYTES`; raises :class:`ConfigError` saying why not."""
    body = bytearray()
    try:
        async with http.stream("GET", url) as response:
            response.raise_for_status()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_CARD_BYTES:
                    raise ConfigError("a2a.remote_agents",
                                      f"the card at {url} is over {MAX_CARD_BYTES} bytes")
        return parse_agent_card(json.loads(body))
    except (httpx.HTTPError, ValueError, TypeError) as exc:
        raise ConfigError("a2a.remote_agents", f"cannot read the Agent Card at {url}: {exc}") from None


class RemoteAgent:
    """One external A2A agent, registered in the mesh under :attr:`name` while started."""

    def __init__(self, spec: RemoteA2aAgent, trusted: list[str], socket: Path | None,
                 verified: Callable[[AgentCard], bool] | None = None) -> None:
        if not host_trusted(spec.url, trusted) and verified is None:
            raise ConfigError("a2a.remote_agents", f"{spec.url}: its host is not in a2a.trusted_hosts "
                              f"({', '.join(trusted) or 'none'}) and no a2a.card_keys are set; a card "
                              "is trusted only from those hosts or signed by those keys")
        self.verified = verified
        self.signed = False
        self.spec = spec
        self.trusted = trusted
        self.socket = socket
        self.name = spec.name or ""
        self.card: AgentCard | None = None
        self.agent: Agent | None = None
        self.cancels_sent = 0
        self._client: Any = None
        self._http: httpx.AsyncClient | None = None
        self._background: set[asyncio.Future[Any]] = set()  # readers after a cancel, CancelTask calls

    async def start(self) -> None:
        headers = {}
        if self.spec.token_file is not None:
            headers["Authorization"] = "Bearer " + self.spec.token_file.read_text(encoding="utf-8").strip()
        self._http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=None))
        card = await fetch_card(self._http, self.spec.url)
        # A card signed by a trusted key is trusted whole, wherever it came from; else only from a
        # trusted host, and only its interfaces on trusted hosts are used.
        self.signed = bool(card.signatures) and self.verified is not None and self.verified(card)
        if not self.signed and not host_trusted(self.spec.url, self.trusted):
            raise ConfigError("a2a.remote_agents", f"{self.spec.url}: the card is not signed by a key of "
                              "a2a.card_keys, and its host is not in a2a.trusted_hosts")
        usable = [i for i in card.supported_interfaces if self.signed or host_trusted(i.url, self.trusted)]
        if not usable:
            raise ConfigError("a2a.remote_agents", f"{self.spec.url}: none of the card's interfaces is on a "
                              "trusted host (a2a.trusted_hosts)")
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(usable)
        self.card = card
        self.name = self.name or mesh_name(card.name)
        self._client = ClientFactory(ClientConfig(
            streaming=card.capabilities.streaming, httpx_client=self._http,
            supported_protocol_bindings=["JSONRPC", "HTTP+JSON"])).create(card)
        caps = [mesh_name(s.id) for s in card.skills][:MAX_CAPABILITIES]
        self.agent = Agent(self.name, socket=self.socket, capabilities=caps,
                           metadata={"a2a_card": self.spec.url, "description": card.description[:300]})
        self.agent.on(ANY_TOPIC)(self._on_request)
        await self.agent.connect()
        log.info("external A2A agent %r (%s) joined the mesh as %r", card.name, self.spec.url, self.name)

    async def try_start(self, wait: float) -> str | None:
        """One :meth:`start` within ``wait`` seconds; None if it joined, else why not (logged)."""
        try:
            await asyncio.wait_for(self.start(), wait)
            return None
        except (MeshError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, MeshError) else f"no answer within {wait:g} s"
            log.warning("external A2A agent %s not joined yet (retrying): %s", self.spec.url, why)
            await self._reset()
            return why

    async def join(self, said: str | None = None, *, first: float = 1.0, most: float = 30.0) -> None:
        """:meth:`start` until it works: a remote agent that is down (or whose mesh name is taken)
        when ``meshd a2a`` starts joins once it can, retried with back-off (``first`` doubling up to
        ``most`` seconds), each distinct failure logged once (``said``: the last one logged)."""
        delay = first
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, most)
            try:
                await self.start()
                return
            except MeshError as exc:
                if exc.message != said:
                    log.warning("external A2A agent %s not joined yet (retrying): %s", self.spec.url,
                                exc.message)
                    said = exc.message
                await self._reset()

    async def _reset(self) -> None:
        if self.agent is not None:
            with contextlib.suppress(Exception):
                await self.agent.close()
        self.agent = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    @property
    def joined(self) -> bool:
        return self.agent is not None

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.close()
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 2.0)
        if self._http is not None:
            await self._http.aclose()

    def _on_request(self, msg: MeshMessage) -> Any:
        return self._ask(msg) if msg.is_request else self._tell(msg)

    async def _tell(self, msg: MeshMessage) -> None:
        """A mesh ``send`` (no answer wanted) is a ``SendMessage`` too; its outcome is only logged."""
        await asyncio.sleep(0)  # into a task first (see _ask)
        try:
            await self._read(msg, _Call())
        except (A2AError, httpx.HTTPError, MeshError) as exc:
            log.info("a message to the A2A agent %r failed: %s", self.name, exc)

    async def _ask(self, msg: MeshMessage) -> Any:
        """One mesh request as one A2A ``SendMessage``; returns the reply payload or raises.

        The stream is read by a task of its own, so a mesh cancel that comes before the remote
        has named its task still cancels it: the reader sends ``CancelTask`` as soon as it
        learns the id (within :data:`CANCEL_GRACE` seconds), then stops."""
        # The agent runs a handler eagerly up to its first suspension, outside any task; httpx
        # (through sniffio) needs to run inside an asyncio task: suspend once, and go on in one.
        await asyncio.sleep(0)
        call = _Call()
        reader = asyncio.ensure_future(self._read(msg, call))
        try:
            return await asyncio.shield(reader)
        except A2AError as exc:  # the remote refused the call, or could not be reached
            code = _failure_code(exc)
            await self._fail(msg, code, f"the A2A agent {self.name!r}: {exc.message}")
            return DEFER
        except httpx.HTTPError as exc:
            await self._fail(msg, "PEER_UNREACHABLE", f"the A2A agent {self.name!r} is unreachable: {exc}")
            return DEFER
        except asyncio.CancelledError:
            call.cancelled = True
            if call.task_id:  # the mesh requester cancelled: so does the A2A task
                self._cancel(call.task_id)
                reader.cancel()
            else:
                asyncio.get_running_loop().call_later(CANCEL_GRACE, reader.cancel)
                self._track(reader)
            raise

    async def _read(self, msg: MeshMessage, call: _Call) -> Any:
        message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex,
                          parts=parts_from_payload(msg.payload), metadata={"topic": msg.topic},
                          task_id=str(msg.headers.get("a2a-task") or ""),
                          context_id=str(msg.headers.get("a2a-context") or ""))
        left = msg.time_left
        # The trace goes on over HTTP: this handler's span if traced here, else the message's own.
        carried = current_headers() or trace_headers(msg.headers)
        context = ClientCallContext(timeout=left if left is not None and left > 0 else None,
                                    service_parameters=carried or None)
        artifacts: list[Any] = []
        stream = self._client.send_message(SendMessageRequest(message=message), context=context)
        async for event in stream:
            if event.HasField("message"):
                return payload_from_parts(event.message.parts)
            if event.HasField("artifact_update"):
                artifacts.append(event.artifact_update.artifact)
                continue
            if event.HasField("task"):
                task = event.task
                task_id, context_id, status = task.id, task.context_id, task.status
                artifacts = list(task.artifacts) or artifacts
            elif event.HasField("status_update"):
                update = event.status_update
                task_id, context_id, status = update.task_id, update.context_id, update.status
            else:
                continue
            if call.cancelled and not call.task_id:  # cancelled before the id was known
                self._cancel(task_id)
                return None
            call.task_id = task_id
            answer = await self._status(msg, task_id, context_id, status, artifacts)
            if answer is not None:
                return answer
        raise MeshError(f"the A2A agent {self.name!r} ended its stream without a final state")

    def _track(self, task: asyncio.Future[Any]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_quiet)

    async def _status(self, msg: MeshMessage, task_id: str, context_id: str, status: Any,
                      artifacts: list[Any]) -> Any:
        note = _text_of(status.message) if status.HasField("message") else ""
        if status.state == TaskState.TASK_STATE_WORKING:
            if note:
                await msg.progress(note)
            return None
        if status.state in INTERRUPTED:  # the typed answer the requester continues from
            return {"state": state_name(status.state), "task_id": task_id, "context_id": context_id,
                    "text": note, "parts": payload_from_parts(status.message.parts) if note else None}
        if status.state == TaskState.TASK_STATE_COMPLETED:
            outs = [payload_from_parts(a.parts) for a in artifacts]
            return outs[0] if len(outs) == 1 else outs or (note or None)
        if status.state in _TERMINAL:
            code = _ERROR_CODES.get(status.state, "HANDLER_ERROR")
            await self._fail(msg, code, f"the A2A agent {self.name!r} ended task {task_id} "
                             f"{state_name(status.state)}: {note or 'no reason given'}")
            return DEFER
        return None

    async def _fail(self, msg: MeshMessage, code: str, text: str) -> None:
        """Answer ``msg`` with error ``code``; its class's retry hint goes with it."""
        assert self.agent is not None
        await self.agent.fail(msg, ERRORS_BY_CODE.get(code, MeshError)(text), code=code)

    def _cancel(self, task_id: str) -> None:
        async def cancel() -> None:
            try:
                await self._client.cancel_task(CancelTaskRequest(id=task_id))
                self.cancels_sent += 1
            except Exception as exc:  # finished already, or gone: the mesh request is cancelled anyway
                log.info("CancelTask %s to %r: %s", task_id, self.name, exc)

        self._track(asyncio.ensure_future(cancel()))


@dataclass(slots=True)
class _Call:
    """One mesh request in flight to the remote: its A2A task once known, and whether the mesh
    requester cancelled it."""

    task_id: str = ""
    cancelled: bool = False


def _failure_code(exc: A2AError) -> str:
    """The meshd code an A2A error of a remote agent becomes (docs/a2a.md, "External agents")."""
    if isinstance(exc, A2AClientTimeoutError):
        return "TIMEOUT"
    if isinstance(exc, A2AClientError):  # the transport: connection refused, HTTP errors
        return "PEER_UNREACHABLE"
    if isinstance(exc, TaskNotFoundError | InvalidParamsError | InvalidRequestError | TaskNotCancelableError
                  | UnsupportedOperationError | ContentTypeNotSupportedError):
        return "VALIDATION_FAILED"
    return "HANDLER_ERROR"


def _quiet(task: asyncio.Future[Any]) -> None:
    """A background reader's outcome nobody awaits: retrieved, so asyncio does not log it."""
    if not task.cancelled():
        task.exception()
