"""The gateway as the daemon runs it: ``Gateway.start()`` / ``Gateway.stop()``.

Owns: the start-up and shutdown order of the HTTP side, the listen-address policy (loopback by
default; a LAN address needs TLS unless ``allow_plain_http_lan``), the token (made at start,
rotated on request, never logged), the files in the runtime dir, and the watch task that sends
snapshots to dashboards and agent/peer state changes to every HTTP agent.

Start-up: 1. check the listen address and TLS; 2. make the token; 3. prepare the outcome
observer (registered on the node's plugin host only while a dashboard is open); 4. bind the
listening sockets (meshd/gateway/listener.py); 5. write ``http.token`` then ``http.json`` (a
client that finds the URL finds the token too); 6. start the watch task. aiohttp and the HTTP
application are imported at the first connection, not at start (an idle daemon does not
pay for aiohttp): the connection waits in the listen backlog until the site serves the sockets.
Shutdown, the reverse: remove the files; stop the watch task; close every HTTP agent (their
pending requests fail with UNDELIVERABLE); close the streams; stop the site (bounded), or close
the listening sockets if nobody ever connected.
Must not touch: routing or the node's internals beyond :class:`~meshd.gateway.dashboard.MeshInfo`;
must not import aiohttp at import time (only ``_serve`` does, in a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshd.errors import ConfigError
from meshd.gateway import auth
from meshd.gateway.dashboard import HISTORY_EVERY, MeshInfo, MeshWatch, OutcomeFeed, OutcomeObserver
from meshd.gateway.events import EventBuffer
from meshd.gateway.listener import PendingListener
from meshd.gateway.sessions import SessionTable
from meshd.util.lazyimport import import_in_thread

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from meshd.config.settings import Settings  # pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.gateway.app import Routes

__all__ = ["Gateway"]

log = logging.getLogger("meshd.gateway")

WATCH_INTERVAL_S = 0.5
SHUTDOWN_TIMEOUT_S = 2.0
ABANDONED_GRACE_S = 60.0  # a session without heartbeat or stream is closed offline_after + this


def check_listen(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for ``http_host``, or None for plain HTTP; refuses plain HTTP on a LAN."""
    host = settings.http_host
    loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    if settings.http_tls_cert is not None and settings.http_tls_key is not None:
        import ssl  # only for TLS: ssl and OpenSSL stay out of a plain-HTTP daemon (meshd/util/lazyssl.py)

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(settings.http_tls_cert, settings.http_tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("http_tls_cert", f"cannot load the certificate and key: {exc}")
        return ctx
    if not loopback and not settings.allow_plain_http_lan:
        raise ConfigError("http_host", f"plain HTTP on {host} (not loopback) is refused: the bearer token "
                          "would travel in clear. Set http_tls_cert and http_tls_key, or "
                          "allow_plain_http_lan = true if you really mean it")
    return None


class Gateway:
    """The HTTP/SSE gateway and dashboard of one daemon, on the daemon's loop."""

    def __init__(self, settings: Settings, node: Any) -> None:
        self.settings = settings
        self.node = node
        self.mesh = MeshInfo(node)
        self.runtime_dir: Path = settings.resolved_socket().parent
        self.token_path = self.runtime_dir / auth.TOKEN_FILE
        self.guard = auth.TokenGuard(auth.new_token())
        self.sessions = SessionTable(settings.resolved_socket(), max_sessions=settings.http_max_sessions,
                                     buffer_size=settings.http_sse_buffer, cap=settings.inbox_cap,
                                     max_payload_bytes=settings.max_payload_bytes)
        self.dashboard = EventBuffer(min(settings.http_sse_buffer, 64))
        self.watch = MeshWatch(self.mesh)
        self.url = ""
        self.routes: Routes | None = None
        self._runner: web.AppRunner | None = None
        self._listener: PendingListener | None = None
        self._tls: ssl.SSLContext | None = None
        self._serving: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.outcome_feed: OutcomeFeed | None = None
        self._parser_errors: logging.Filter | None = None  # meshd.gateway.app.ParserErrors, once serving

    async def start(self) -> None:
        s = self.settings
        tls = check_listen(s)
        self._loop = asyncio.get_running_loop()
        token = auth.new_token()
        self.guard.replace(token)
        self.outcome_feed = OutcomeFeed(getattr(self.node, "plugins", None),
                                        OutcomeObserver(self._loop, self.watch.add_outcome))
        self._tls = tls
        self._listener = PendingListener(s.http_host, s.http_port)
        self._listener.bind()
        port = self._listener.bound_port()
        host = f"[{s.http_host}]" if ":" in s.http_host else s.http_host
        self.url = f"{'https' if tls else 'http'}://{host}:{port}/"
        self.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        auth.write_token(self.runtime_dir, token, group_readable=s.http_token_group_readable)
        auth.write_url(self.runtime_dir, self.url, group_readable=s.http_token_group_readable)
        self._watch_task = asyncio.create_task(self._watch_loop(), name="meshd-gateway-watch")
        self._listener.on_first_connection(self._loop, self._begin_serving)
        log.info("HTTP gateway on %s (token in %s)", self.url, self.token_path)

    def _begin_serving(self) -> None:
        self._serving = asyncio.create_task(self._serve(), name="meshd-gateway-serve")

    async def _serve(self) -> None:
        """First connection: import aiohttp and the application, then serve the bound sockets."""
        assert self._listener is not None
        pending: list[socket.socket] = []
        try:
            app_module = await import_in_thread("meshd.gateway.app")
            from aiohttp import web  # already imported by meshd.gateway.app, in the thread

            app, self.routes = app_module.build_app(self)
            self._parser_errors = app_module.ParserErrors()
            http_log = logging.getLogger("meshd.gateway.http")
            http_log.addFilter(self._parser_errors)
            runner = web.AppRunner(app, access_log=None, handle_signals=False, logger=http_log,
                                   shutdown_timeout=SHUTDOWN_TIMEOUT_S)
            await runner.setup()
            self._runner = runner
            pending = self._listener.hand_over()
            while pending:
                await web.SockSite(runner, pending[0], ssl_context=self._tls).start()
                pending.pop(0)  # the site owns it now (runner.cleanup closes it)
        except Exception:
            log.exception("the HTTP gateway could not start serving; HTTP connections are refused")
        else:
            log.info("HTTP gateway serving (aiohttp loaded at the first connection)")
        finally:
            self._listener.close()
            for sock in pending:
                sock.close()

    async def stop(self) -> None:
        auth.remove_files(self.runtime_dir)
        if self._serving is not None and not self._serving.done():
            self._serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving
        if self._listener is not None:
            self._listener.close()
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self.sessions.close_all()
        self.dashboard.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._parser_errors is not None:
            logging.getLogger("meshd.gateway.http").removeFilter(self._parser_errors)
        log.info("HTTP gateway stopped")

    def rotate_token(self) -> None:
        """A new token: written to http.token first, then required (the old one stops working)."""
        token = auth.new_token()
        auth.write_token(self.runtime_dir, token, group_readable=self.settings.http_token_group_readable)
        self.guard.replace(token)
        log.info("HTTP gateway token rotated (new token in %s)", self.token_path)

    def dashboard_opened(self) -> None:
        """A dashboard stream opened: watch outcomes, and give it a snapshot at once."""
        if self.outcome_feed is not None:
            self.outcome_feed.opened()
        self._publish_snapshot()

    def dashboard_closed(self) -> None:
        if self.outcome_feed is not None:
            self.outcome_feed.closed()

    def stats(self) -> dict[str, Any]:
        r = self.routes
        return {"sessions": len(self.sessions.by_id), "streams": r.streams if r else 0,
                "slow_disconnects": r.slow_disconnects if r else 0,
                "closed_streams": r.closed_streams if r else 0, "auth_refused": self.guard.refused,
                "bad_requests": getattr(self._parser_errors, "count", 0),
                "checked_responses": r.checked_responses if r else 0,
                "invalid_responses": r.invalid_responses if r else 0}

    def _publish_snapshot(self) -> None:
        self.dashboard.append("snapshot", self.watch.snapshot(self.stats()))

    async def _watch_loop(self) -> None:
        tick = 0
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                if tick % HISTORY_EVERY == 0:  # the charts' history is kept from start
                    self.watch.sample()
                tick += 1
                await self.sessions.sweep(self.settings.offline_after + ABANDONED_GRACE_S)
                changes = self.watch.changes()
                for name, data in changes:
                    for session in self.sessions.by_id.values():
                        session.events.append(name, data)
                if self.routes is not None and self.routes.dashboards:
                    self._publish_snapshot()
            except Exception:
                log.exception("gateway watch failed; going on")
