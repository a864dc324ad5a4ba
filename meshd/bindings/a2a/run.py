"""``meshd a2a``: its options, the checks before anything binds, and its lifetime.

The process attaches to the local daemon as one agent (``--name``, default ``a2a-<pid>``), serves
the exposed mesh agents over A2A (meshd/bindings/a2a/server.py) and registers one more agent per
external A2A agent of ``[[a2a.remote_agents]]``. It reads the ``[a2a]`` section of the daemon's
config file (``--config``; flags win). Like ``meshd mcp --http``: loopback by default, another
address only with TLS; a bearer token in a 0600 file (``a2a-NAME.token`` beside the agent socket,
or ``--token-file``); the URL file ``a2a-NAME.json`` (url, catalog, pid, token file) tells local
clients where to connect. Both files are removed when it stops (SIGINT/SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from meshd.bindings.attached import run_attached
from meshd.config.sections import A2aSettings
from meshd.errors import ConfigError, MeshError
from meshd.util.paths import find_agent_socket

__all__ = ["A2A_EXTRA_HINT", "A2aOptions", "check_options", "run_a2a"]

log = logging.getLogger("meshd.a2a")

REMOTE_START_WAIT: Final = 10.0  # seconds a remote agent may take to join before the server starts
A2A_EXTRA_HINT: Final = "meshd a2a needs the 'a2a' extra: pip install 'meshd-daemon[a2a]'"


@dataclass(frozen=True, slots=True)
class A2aOptions:
    """``meshd a2a``'s flags (meshd/cli/main.py fills them); ``settings`` is the ``[a2a]`` section."""

    settings: A2aSettings
    socket: Path | None = None
    name: str | None = None
    listen: str | None = None
    token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    state_dir: Path | None = None  # the daemon's: where LAN admissions are remembered


def check_options(opts: A2aOptions) -> tuple[str, int, bool]:
    """The listen address and TLS, checked before anything attaches or binds: (host, port, tls).
    Raises :class:`ConfigError` naming the key or flag (exit 2)."""
    from meshd.bindings.mcp_http import is_loopback, parse_listen

    try:
        host, port = parse_listen(opts.listen or opts.settings.listen)
    except ConfigError as exc:
        raise ConfigError("--listen" if opts.listen else "a2a.listen", exc.message) from None
    if (opts.tls_cert is None) != (opts.tls_key is None):
        raise ConfigError("--tls-cert", "give both --tls-cert and --tls-key, or neither")
    tls = opts.tls_cert is not None
    if not tls and not is_loopback(host):
        raise ConfigError("a2a.listen", f"plain HTTP on {host} (not loopback) is refused: the bearer "
                          "token would travel in clear; give --tls-cert and --tls-key")
    if opts.tls_client_ca is not None and not tls:
        raise ConfigError("--tls-client-ca", "client certificates need TLS (--tls-cert, --tls-key)")
    if opts.tls_cert is not None and opts.tls_key is not None:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(opts.tls_cert, opts.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("--tls-cert", f"cannot load the certificate and key: {exc}") from None
    if opts.settings.max_timeout < opts.settings.default_timeout:
        raise ConfigError("a2a.default_timeout", "must not exceed a2a.max_timeout")
    return host, port, tls


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


async def _join(remote: Any, own: set[str], said: str) -> None:
    await remote.join(said)
    own.add(remote.name)


async def _advertise(lan: Any, served: Any, cards: Any, port: int) -> None:
    """Keep the DNS-SD advertisements equal to the served agents (checked every 2 s)."""
    while True:
        with contextlib.suppress(MeshError):
            names = [str(r["name"]) for r in await served.served()]
            await lan.advertise({n: cards.card_url(n) for n in names}, port)
        await asyncio.sleep(2.0)


async def _serve(opts: A2aOptions, name: str) -> None:
    import uvicorn

    from meshd.bindings.a2a.admission import LanAdmission
    from meshd.bindings.a2a.cards import CATALOG_PATH, CardMaker
    from meshd.bindings.a2a.ctl import BINDING_META, TOPIC_LAN
    from meshd.bindings.a2a.executor import ExposePolicy
    from meshd.bindings.a2a.remote import RemoteAgent
    from meshd.bindings.a2a.server import A2aGate, ServedAgents, build_app
    from meshd.bindings.a2a.store import BoundedTaskStore
    from meshd.bindings.mcp_http import bind_listener, quiet_uvicorn, read_or_make_token
    from meshd.client import Agent

    host, port, tls = check_options(opts)
    s = opts.settings
    from meshd.bindings.a2a.signing import card_signer, card_verifier

    verified = card_verifier(list(s.card_keys))
    signer = card_signer(s.signing_key, s.signing_key_id) if s.signing_key is not None else None
    remotes = [RemoteAgent(spec, s.trusted_hosts, opts.socket, verified) for spec in s.remote_agents]
    runtime_dir = (opts.socket or find_agent_socket()).parent
    token_path = opts.token_file or runtime_dir / f"a2a-{name}.token"
    url_file = runtime_dir / f"a2a-{name}.json"
    lan: Any = None
    tasks: list[asyncio.Task[None]] = []
    async with Agent(name, socket=opts.socket, metadata={BINDING_META: True}) as agent:
        token, made = read_or_make_token(token_path)
        sock = bind_listener(host, port)
        try:
            port = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            base = f"{'https' if tls else 'http'}://{shown}:{port}"
            hosts = [f"{n}:{port}" for n in ({shown, "127.0.0.1", "localhost"} if host in
                                              ("127.0.0.1", "localhost") else {shown})]
            policy = ExposePolicy(list(s.expose), topic=s.topic, default_timeout=s.default_timeout,
                                  max_timeout=s.max_timeout, through_tools=s.through_tools, own={name},
                                  default_agent=s.default_agent, tasks_agent=s.tasks_agent)
            cards = CardMaker(base, bearer=True, mtls=opts.tls_client_ca is not None, signer=signer)
            served = ServedAgents(agent, policy)
            store = BoundedTaskStore(s.max_tasks)
            app = build_app(agent, policy, cards, store, served)
            extra: dict[str, Any] = {}
            if opts.tls_client_ca is not None:
                import ssl

                extra = {"ssl_ca_certs": str(opts.tls_client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
            gate = A2aGate(app, token, hosts, s.max_body_bytes)
            config = uvicorn.Config(gate, log_level="warning",
                                    lifespan="off", limit_concurrency=s.max_connections,
                                    ssl_certfile=str(opts.tls_cert) if tls else None,
                                    ssl_keyfile=str(opts.tls_key) if tls else None, **extra)
            for remote in remotes:  # each joins now if it can, else in the background once it can
                why = await remote.try_start(REMOTE_START_WAIT)
                if why is None:
                    policy.own.add(remote.name)
                else:
                    tasks.append(asyncio.create_task(_join(remote, policy.own, why)))
            if s.lan_discovery:
                from meshd.bindings.a2a.lan import LanDiscovery

                info = await agent.node_info()
                lan = LanDiscovery(list(s.lan_interfaces) or [host], binding_id=f"{agent.node}-{port}",
                                   mesh=str(info.get("mesh", "")), max_discovered=s.lan_max_discovered)
                await lan.start()
                tasks.append(asyncio.create_task(_advertise(lan, served, cards, port)))
            memory = opts.state_dir / f"a2a-{name}-admitted.json" if opts.state_dir else None

            def stats() -> dict[str, Any]:  # meshctl a2a stats: what was bounded, refused, dropped
                return {"tasks": len(store), "tasks_max": store.max_tasks, "tasks_refused": store.refused,
                        "tasks_evicted": store.evicted, "notes_dropped": app.state.executor.notes_dropped,
                        "http_refused": dict(gate.refused),
                        "remote_agents": {r.spec.url: r.name if r.joined else None for r in remotes},
                        "lan": None if lan is None else {"discovered": len(lan.discovered),
                                                         "dropped": lan.dropped, "ignored": lan.ignored,
                                                         "advertised": lan.advertised}}

            admission = LanAdmission(agent, lan, remotes, socket=opts.socket, own=policy.own, store=memory,
                                     limit=s.lan_max_discovered, verified=verified, stats=stats)
            if lan is not None:
                admission.rejoin()
            agent.on(TOPIC_LAN)(admission.handle)
            _write_private(url_file, json.dumps({
                "url": base, "catalog": base + CATALOG_PATH, "pid": os.getpid(),
                "token_file": str(token_path), "agent": name,
                "remote_agents": {r.name: r.spec.url for r in remotes if r.joined},
                "remote_agents_waiting": [r.spec.url for r in remotes if not r.joined]}) + "\n")
            log.info("A2A on %s (catalog %s%s, bearer token in %s)", base, base, CATALOG_PATH, token_path)
            try:
                await quiet_uvicorn()(config).serve(sockets=[sock])
            finally:
                # Tasks still running are closed while the agent is attached: their mesh requests
                # are cancelled (the handlers hear it), not left to time out.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(app.state.handler.aclose(), 5.0)
        finally:
            sock.close()
            for task in tasks:
                task.cancel()
            if lan is not None:
                with contextlib.suppress(Exception):
                    await lan.stop()
            for remote in remotes:
                with contextlib.suppress(Exception):
                    await remote.close()
            with contextlib.suppress(FileNotFoundError):
                url_file.unlink()
            if made:
                with contextlib.suppress(FileNotFoundError):
                    token_path.unlink()


def run_a2a(opts: A2aOptions) -> int:
    """``meshd a2a``: serve until SIGINT/SIGTERM; returns the exit code (2: the extra is missing,
    an option is bad, or a remote card cannot be trusted or read; 1: the daemon refused)."""
    # The SDK opens OpenTelemetry spans around every call (about a hundred a request): with no
    # OTel SDK configured they record nothing and cost ~10% of a request. Off unless asked for.
    os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")
    try:
        check_options(opts)
        import a2a  # noqa: F401
        import uvicorn  # noqa: F401
    except ConfigError as exc:
        print(f"meshd a2a: {exc}", file=sys.stderr)
        return 2
    except ImportError:
        print(f"meshd: {A2A_EXTRA_HINT}", file=sys.stderr)
        return 2
    return run_attached("meshd a2a", "meshd.a2a", _serve(opts, opts.name or f"a2a-{os.getpid()}"))
