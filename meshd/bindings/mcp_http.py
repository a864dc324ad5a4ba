"""``meshd mcp --http``: the MCP server on Streamable HTTP, for MCP clients that connect by URL.

Owns the HTTP side of the MCP binding: the listen-address policy (loopback by default; another
address needs TLS, as for the gateway), the bearer token (a random token in a 0600 file, the same
kind as the gateway's ``http.token``: ``mcp-<name>.token`` beside the agent socket, or the file
``--token-file`` names), the URL file (``mcp-<name>.json``: url, pid, token file) that tells
local clients where to connect, the ``Authorization`` check in constant time (before the SDK sees
a request), the Host and Origin checks (the SDK's ``TransportSecuritySettings``: DNS-rebinding
protection) and uvicorn's lifetime. The MCP endpoint is ``/mcp``. Must not touch the mesh (the
bridge does) or the gateway (its own process and token).
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from meshd.errors import ConfigError
from meshd.util.paths import find_agent_socket

if TYPE_CHECKING:
    from meshd.bindings.mcp import McpOptions

__all__ = ["DEFAULT_HTTP", "MCP_PATH", "BearerGate", "bind_listener", "check_http", "is_loopback",
           "parse_listen", "quiet_uvicorn", "read_or_make_token", "serve_http"]

log = logging.getLogger("meshd.mcp")

DEFAULT_HTTP: Final = "127.0.0.1:8767"
MCP_PATH: Final = "/mcp"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT``, ``HOST`` or ``:PORT`` (defaults from :data:`DEFAULT_HTTP`)."""
    default_host, default_port = DEFAULT_HTTP.rsplit(":", 1)
    host, port = text, default_port
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or default_port
    elif text.count(":") == 1:
        host, port = text.split(":")
    host = host or default_host
    try:
        number = int(port)
        if host != "localhost":
            ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError("--http", f"{text!r} is not HOST:PORT with an IP address (or localhost) and "
                          "a port number") from None
    if not 0 <= number <= 65535:
        raise ConfigError("--http", f"port {number} is out of range 0-65535")
    return host, number


def is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def new_token() -> str:
    """256 random bits, URL-safe (as the gateway makes its token)."""
    return base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")


def read_or_make_token(path: Path) -> tuple[str, bool]:
    """The token in ``path`` (which must be private to this user), or a new one written there
    with mode 0600; returns it and whether this process made the file."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        token = new_token()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, (token + "\n").encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return token, True
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError("--token-file", f"{path} must be a regular file of this user with mode 0600 "
                          f"(it is {stat.filemode(st.st_mode)}); fix: chmod 600 {path}")
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < 16:
        raise ConfigError("--token-file", f"{path} holds no token of at least 16 characters")
    return token, False


class BearerGate:
    """ASGI middleware in front of the MCP app. First the Host and Origin headers (DNS-rebinding
    protection, as the SDK's ``TransportSecuritySettings`` does them: a foreign Host gets 421, a
    foreign Origin 403, whatever the token), then ``Authorization: Bearer <token>`` (401 without
    it). Counts refusals."""

    def __init__(self, app: Any, token: str, hosts: list[str], origins: list[str]) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self._hosts = frozenset(h.encode() for h in hosts)
        self._origins = frozenset(o.encode() for o in origins)
        self.refused = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        origin = headers.get(b"origin")
        if headers.get(b"host") not in self._hosts:
            await self._refuse(send, 421, "MISDIRECTED", "this Host is not served here (DNS-rebinding "
                               "protection); connect to the URL in meshd mcp's URL file")
        elif origin is not None and origin not in self._origins:
            await self._refuse(send, 403, "FORBIDDEN_ORIGIN", "this Origin is not allowed (meshd mcp "
                               "--allow-origin adds one)")
        elif not hmac.compare_digest(headers.get(b"authorization", b""), self._expected):
            await self._refuse(send, 401, "UNAUTHORIZED", "a bearer token is required (see the token "
                               "file named in meshd mcp's URL file)")
        else:
            await self.app(scope, receive, send)

    async def _refuse(self, send: Any, status: int, code: str, message: str) -> None:
        self.refused += 1
        body = json.dumps({"error": code, "message": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="meshd-mcp"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _security(host: str, port: int, extra_origins: tuple[str, ...]) -> Any:
    """The SDK's ``TransportSecuritySettings``: the Host values and Origins this server accepts."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = ["127.0.0.1", "localhost", "[::1]"] if is_loopback(host) else []
    shown = f"[{host}]" if ":" in host else host
    if shown not in names:
        names.append(shown)
    hosts = [f"{n}:{port}" for n in names]
    origins = [f"{scheme}://{n}:{port}" for n in names for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=[*origins, *extra_origins])


def bind_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY on an accepted connection only when the socket
    # says it is TCP (proto 0 does not). Without it, a response written as headers then body waits
    # for the client's delayed ACK: ~40 ms per request on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError("--http", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def quiet_uvicorn() -> type[Any]:
    import uvicorn

    class Quiet(uvicorn.Server):
        """uvicorn's server, stopped by SIGINT/SIGTERM without re-raising the signal afterwards
        (uvicorn's own capture does that, which would kill this process before it cleans up)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            def stop(sig: int, frame: Any) -> None:
                self.force_exit = self.should_exit and sig == signal.SIGINT
                self.should_exit = True

            before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    return Quiet


def check_http(opts: McpOptions) -> tuple[str, int, bool]:
    """``opts``' listen address and TLS, checked before anything attaches or binds: returns
    (host, port, tls); raises :class:`ConfigError` naming the flag (exit 2)."""
    host, port = parse_listen(opts.http or DEFAULT_HTTP)
    if (opts.tls_cert is None) != (opts.tls_key is None):
        raise ConfigError("--tls-cert", "give both --tls-cert and --tls-key, or neither")
    tls = opts.tls_cert is not None and opts.tls_key is not None
    if not tls and not is_loopback(host):
        raise ConfigError("--http", f"plain HTTP on {host} (not loopback) is refused: the bearer token "
                          "would travel in clear; give --tls-cert and --tls-key")
    if opts.tls_cert is not None and opts.tls_key is not None:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(opts.tls_cert, opts.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("--tls-cert", f"cannot load the certificate and key: {exc}") from None
    return host, port, tls


def _write_url_file(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (json.dumps(info) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


async def serve_http(server: Any, opts: McpOptions, name: str) -> None:
    """Serve ``server`` on Streamable HTTP at ``opts.http`` until SIGINT or SIGTERM; the files it
    made (token, URL file) are removed when it stops, whatever stopped it."""
    import uvicorn

    host, port, tls = check_http(opts)
    runtime_dir = (opts.socket or find_agent_socket()).parent
    token_path = opts.token_file or runtime_dir / f"mcp-{name}.token"
    url_file = runtime_dir / f"mcp-{name}.json"
    token, made = read_or_make_token(token_path)
    try:
        sock = bind_listener(host, port)
        try:
            port = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            url = f"{'https' if tls else 'http'}://{shown}:{port}{MCP_PATH}"
            security = _security(host, port, opts.allowed_origins)
            app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host,
                                             transport_security=security)
            gate = BearerGate(app, token, security.allowed_hosts, security.allowed_origins)
            config = uvicorn.Config(gate, log_level="warning", lifespan="on",
                                    ssl_certfile=str(opts.tls_cert) if tls else None,
                                    ssl_keyfile=str(opts.tls_key) if tls else None)
            _write_url_file(url_file, {"url": url, "pid": os.getpid(), "token_file": str(token_path)})
            log.info("MCP on Streamable HTTP at %s (bearer token in %s)", url, token_path)
            await quiet_uvicorn()(config).serve(sockets=[sock])
        finally:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                url_file.unlink()
    finally:
        if made:
            with contextlib.suppress(FileNotFoundError):
                token_path.unlink()
