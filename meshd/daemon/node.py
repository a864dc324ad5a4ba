"""The daemon's composition root: it builds the parts, wires them, and owns start/stop and timers.

One ``Node`` per host, in one asyncio loop: the reactor (meshd.transport) drives the sockets,
timers drive heartbeats, liveness and qos-1 retries, zeroconf runs in the same loop. The parts,
each owning its state (docs/architecture.md draws them):

  security.py   CURVE keys, trust store, ZAP gate, trust policy
  peers.py      the peer table: dials, HELLO, gossip, peer control, liveness, redials
  directory.py  local and remote agents, the name-conflict rule, the topic index
  agents.py     the local agent socket: its link and its control plane (register, subscribe, ...)
  routing.py    the edge checks and the data path: route, deliver, bounce, publish
  qos1.py       the qos-1 outbox and seen-set (SQLite) and the qos-1 machine (sans I/O)
  qos1_driver.py  performs the machine's actions, schedules the group commit
  deadletters.py  the bounded dead-letter FIFO
  admin.py      meshctl's queries and dead-letter operations
  outcomes.py   collaboration outcomes for observer plugins
  timers.py     what the periodic loops do (this module starts and stops them)

This module must not hold routing or protocol logic: it only composes. Parts never call each
other through the node's attributes; they get what they need when built (see ``_build``).

Start-up is the sequence ``START_STEPS`` (one method ``_start_<step>`` each); shutdown is
``STOP_STEPS`` (``_stop_<step>``), run in that order even after a failed start (each stop step
releases only what exists). To add a part (a gateway, a tools service), add a step to both
tuples at the place it belongs and write the two methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket as pysocket
import stat
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import zmq

from meshd import transport
from meshd.daemon.address_watch import AddressWatcher
from meshd.daemon.admin import Admin, letter_summary
from meshd.daemon.doctor import daemon_report
from meshd.daemon.sdnotify import Notifier
from meshd.daemon.timers import TimerLoops
from meshd.delivery.consumer_lag import ConsumerLag
from meshd.delivery.dead_letters import DeadLetters
from meshd.delivery.handover import peers_settled
from meshd.delivery.local_agents import AgentLink, LocalAgents
from meshd.delivery.outcomes import Outcomes
from meshd.delivery.qos1_driver import Qos1Driver
from meshd.delivery.router import Router
from meshd.discovery.mdns import Discovery, default_interfaces
from meshd.errors import ConfigError, StartupError, StateFileError
from meshd.mesh.directory import Directory, LocalAgent
from meshd.mesh.directory_updates import DirectoryUpdates
from meshd.mesh.liveness import PeerState
from meshd.mesh.peers import Peer, PeerEvents, PeerTable
from meshd.mesh.security import Security
from meshd.plugins.builtin import JsonlDeadLetterSink
from meshd.plugins.host import PluginHost
from meshd.qos1.machine import DeliveryStore, OutboxBounds, Qos1
from meshd.util.logonce import LogOnce
from meshd.util.shutdown import Shutdown
from meshd.util.statefiles import make_private_file
from meshd.util.supervise import supervised
from meshd.view import MetricsSnapshot
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError

if TYPE_CHECKING:  # meshd.config imports pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.config.settings import Settings

__all__ = ["START_STEPS", "STOP_STEPS", "Node", "load_node_id"]

log = logging.getLogger("meshd.node")

START_STEPS: Final = (
    "identity",   # load or create the node id (a restarted daemon is the same peer again)
    "security",   # CURVE keys, trust store, ZAP handler: before any server socket exists
    "delivery",   # open the qos-1 store (outbox and seen-set) and resume what it holds
    "sockets",    # bind the mesh ROUTER, the XPUB, the local agent socket (0660); build the parts
    "discovery",  # advertise and browse with zeroconf; dial static peers (HELLO)
    "timers",     # heartbeats, liveness, qos-1 retries, trust reload, metrics snapshot
    "gateway",    # the HTTP/SSE gateway and dashboard (meshd/gateway), when [http] is on
    "plugins",    # meshd_startup, then each plugin's worker (no observer call before startup)
    "system",     # the system agent serving syscall tools, tasks, spawning (meshd/tools); READY=1
)
STOP_STEPS: Final = (
    "gateway",    # STOPPING=1; the HTTP agents leave cleanly
    "system",     # the system agent leaves (its tasks stay in tasks.db for the next start)
    "plugins",    # plugins drain their queues, then meshd_shutdown
    "timers",     # cancel the timers; from here on nobody is greeted
    "discovery",  # BYE to every peer (they drop us at once); mDNS goodbye
    "sockets",    # stop the reactor; close the qos-1 store (commit); close sockets (bounded
                  # linger); terminate the context; remove the agent socket file if we bound it
    "workers",    # stop the plugin worker (bounded)
)


def load_node_id(state_dir: Path) -> str:
    """The node id, created once and kept, so a restarted daemon is the same peer again."""
    path = state_dir / "node_id"
    try:
        node_id = path.read_text().strip()
        if len(node_id) == 16 and all(c in "0123456789abcdef" for c in node_id):
            return node_id
        log.warning("ignoring malformed node id in %s", path)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise StateFileError(path, "is a directory" if isinstance(exc, IsADirectoryError) else
                             "is not text", "remove it and start again: the daemon makes a new node id "
                             "(peers then see a new node)") from None
    node_id = os.urandom(8).hex()
    tmp = path.with_suffix(".tmp")
    make_private_file(tmp)
    tmp.write_text(node_id + "\n")
    os.replace(tmp, path)
    return node_id


def _socket_in_use(path: Path) -> bool:
    probe = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


class Node:
    """A meshd daemon. ``await start()``, then ``await stop()``; or ``await serve(trigger)``.

    It implements :class:`meshd.view.NodeView`, the face plugins get.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.node_id = ""
        self.incarnation = os.urandom(4).hex()
        self.name = settings.name
        self.stats: Counter[str] = Counter()
        self.interfaces: list[str] = []
        self.router_port = 0
        self.pub_port = 0
        self.socket_path = settings.resolved_socket()
        self.started_at = 0.0
        self.ready = asyncio.Event()
        self._quiet = LogOnce(log)  # bounded: many keys come from peers
        self._max_frame = settings.max_payload_bytes + P.BATCH_OVERHEAD + 4096
        self._ctx: zmq.Context[Any] | None = None
        self._reactor: transport.Reactor | None = None
        self._discovery: Discovery | None = None
        self._timers: list[asyncio.Task[None]] = []
        self.timer_loops = TimerLoops(self)  # what the timers do (meshd/daemon/timers.py)
        self._stopping = False
        self._socket_bound = False
        self._sockets: list[zmq.Socket[Any]] = []
        self._snapshot_lock = threading.Lock()
        self._snapshot: MetricsSnapshot | None = None
        #: One flag every part reads once the shutdown begins (meshd/util/shutdown.py).
        self.shutdown = Shutdown()
        # Parts that need neither the node id nor a socket are built now; the rest in dependency
        # order by the steps (identity: directory and peers; sockets: _build). Where a part calls
        # one built after it, the call goes through a method of this node, as PeerEvents' do.
        self.notifier = Notifier()
        # Each plugin's own config section and queue bound; load() raises ConfigError (exit 2)
        # for a section its plugin's model refuses.
        self.plugins = PluginHost(settings.plugins, queue_size=settings.plugin_queue_size,
                                  sections=settings.plugin_sections, on_change=self._track_outcomes)
        self.plugins.load()
        if settings.dead_letter_jsonl:
            self.plugins.register(JsonlDeadLetterSink(settings.state_dir / "deadletters.jsonl"),
                                  name="meshd.jsonl_dead_letters")
        self.outcomes = Outcomes(self.plugins)
        self.consumer_lag = ConsumerLag()  # each local agent's lag, sampled with every snapshot
        # On from the start: agents may attach (and be observed) before the plugins step runs;
        # their outcomes wait in the plugins' queues until the workers start after meshd_startup.
        self._track_outcomes()
        # the FIFO; ``dead_letters(limit)`` is the NodeView's read of it
        self.dead_letter_fifo = DeadLetters(settings.dead_letter_capacity, sink=self.plugins.dead_letter)
        self.security = Security(settings)
        self.directory: Directory
        self.peer_table: PeerTable
        self.dir_updates: DirectoryUpdates
        self.store: DeliveryStore | None = None
        self._qos_machine: Qos1 | None = None
        self.qos: Qos1Driver
        self.agents_sock: zmq.Socket[Any] | None = None
        self.local_agents: LocalAgents
        self.routing: Router
        self.admin: Admin
        self.gateway: Any = None  # meshd.gateway.Gateway when [http] is on
        self.system: Any = None  # meshd.tools.service.SystemAgent
        self._system_token = os.urandom(16).hex()

    # ----------------------------------------------------------------------------- NodeView

    def info(self) -> dict[str, Any]:
        """What ``meshctl node`` prints: identity, endpoints, counters."""
        return self.node_info()

    def agents(self) -> list[dict[str, Any]]:
        return self.admin.agent_list()

    def peers(self) -> list[dict[str, Any]]:
        return self.admin.peer_list()

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest ``limit`` dead letters kept, oldest first, as ``meshctl deadletters list``
        shows them (NodeView)."""
        kept = self.dead_letter_fifo.list()
        return [letter_summary(d) for d in kept[max(len(kept) - limit, 0):]] if limit > 0 else []

    def _track_outcomes(self) -> None:
        """The plugins changed: outcome tracking follows them (PluginHost's ``on_change``)."""
        outcomes = getattr(self, "outcomes", None)  # PluginHost may call before Outcomes exists
        if outcomes is not None:
            outcomes.follow_plugins()

    def record_dead_letter(self, reason: str, detail: str, fields: dict[str, Any]) -> None:
        """A dead letter that is no message (a failed task, from the system agent): kept in the
        FIFO (``meshctl deadletters list``) and handed to the dead-letter hook."""
        self.dead_letter_fifo.record(reason, detail, [], dict(fields))

    def is_local_agent(self, name: str) -> bool:
        """Whether ``name`` is registered on this daemon (the system agent serves only those)."""
        return name in self.directory.local

    @property
    def mesh(self) -> str:
        return self.settings.mesh

    def metrics_snapshot(self) -> MetricsSnapshot:
        """The latest consistent reading (rebuilt on the loop every second). Thread-safe."""
        with self._snapshot_lock:
            snap = self._snapshot
        return snap if snap is not None else MetricsSnapshot(self.node_id, self.name, self.settings.mesh, 0.0)

    def _take_snapshot(self) -> None:
        """Build a MetricsSnapshot on the loop (plain copies only) and swap it in."""
        directory: Directory = getattr(self, "directory", None) or Directory()  # built at identity
        local = Counter(str(a.state) for a in directory.local.values())
        peer_table: PeerTable | None = getattr(self, "peer_table", None)
        qos = getattr(self, "qos", None)
        routing: Router | None = getattr(self, "routing", None)
        snap = MetricsSnapshot(
            node_id=self.node_id, name=self.name, mesh=self.settings.mesh,
            uptime_s=time.monotonic() - self.started_at if self.started_at else 0.0,
            peers_by_state=(peer_table.by_state() if peer_table is not None
                            else dict.fromkeys((str(p) for p in PeerState), 0)),
            local_agents_by_state={"online": local.get("online", 0), "stale": local.get("stale", 0)},
            agent_telemetry={a.name: dict(a.telemetry) for a in directory.local.values()},
            qos1_pending=qos.pending if qos is not None else 0,
            qos1_in_flight=qos.in_flight if qos is not None else 0,
            qos1_pending_by_dest=qos.pending_by_dest() if qos is not None else {},
            dead_letters_total=self.dead_letter_fifo.total,
            events=dict(self.stats),
            plugin_queue=self.plugins.queued,
            plugin_stats=dict(self.plugins.stats),
            plugin_hook_time={(p, h): (int(t["calls"]), t["seconds"], t["cpu_seconds"])
                              for p, hooks in self.plugins.hook_times().items() for h, t in hooks.items()},
            collaborations=dict(self.outcomes.tally.counts),
            collaboration_errors=dict(self.outcomes.tally.errors),
            latency=self.outcomes.tally.readings(),
            messages=routing.traffic.snapshot() if routing is not None else {},
            agent_lag=self.consumer_lag.sample(directory.local.values(), time.monotonic()),
        )
        with self._snapshot_lock:
            self._snapshot = snap

    # ----------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Run ``START_STEPS`` in order. Raises StartupError / ConfigError / KeyFileError."""
        for step in START_STEPS:
            await getattr(self, f"_start_{step}")()

    async def _start_identity(self) -> None:
        s = self.settings
        s.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.node_id = load_node_id(s.state_dir)
        self.interfaces[:] = list(s.interfaces) or default_interfaces()
        if not self.interfaces:
            raise StartupError("identity", "no usable network interface: pass --interface IP")
        self._build_peers()
        self._ctx = zmq.Context()
        self._reactor = transport.Reactor(asyncio.get_running_loop())

    def _build_peers(self) -> None:
        """The parts that need the node id: the directory, the peer table, directory updates."""
        s = self.settings
        self.directory = Directory(self.node_id, journal_max_bytes=s.directory_max_bytes)
        self.peer_table = PeerTable(
            s, node_id=self.node_id, name=self.name, incarnation=self.incarnation, security=self.security,
            stats=self.stats, quiet=self._quiet, interfaces=self.interfaces, max_frame=self._max_frame,
            shutdown=self.shutdown,
            events=PeerEvents(
                state_changed=self._peer_state_changed, directory=self._peer_directory,
                restarted=self._peer_restarted, acks=self._peer_acks, nacks=self._peer_nacks,
                reject=self._reject_control,
                topic_message=self._on_topic, topic_keys=self.directory.sub_keys,
                directory_body=self._directory_body, directory_version=self._directory_version,
                telemetry=self._telemetry,
            ),
        )
        self.dir_updates = DirectoryUpdates(self.directory, self.stats, peer_table=self.peer_table,
                                            evict=self._evict_local)

    async def _start_security(self) -> None:
        assert self._ctx is not None and self._reactor is not None
        self.security.start(self._ctx, self._reactor, self.interfaces)

    async def _start_delivery(self) -> None:
        s = self.settings
        self.store = DeliveryStore(s.state_dir / "delivery.db", seen_ttl=2 * s.qos1_ttl + 60.0)
        bounds = OutboxBounds(total_units=s.qos1_outbox_max, total_bytes=s.qos1_outbox_max_bytes,
                              per_dest_units=s.qos1_outbox_per_dest_max,
                              per_dest_bytes=s.qos1_outbox_per_dest_max_bytes)
        self._qos_machine = Qos1(self.store, attempts=s.qos1_attempts, ack_timeout=s.qos1_ack_timeout,
                                 ttl=s.qos1_ttl, bounds=bounds)

    async def _start_sockets(self) -> None:
        s, ctx, reactor = self.settings, self._ctx, self._reactor
        assert ctx is not None and reactor is not None
        curve = self.security.curve
        beats = self.peer_table.zmtp_beats
        self.router = transport.mesh_router(ctx, self._max_frame, curve, beats)
        self._sockets.append(self.router)
        self.router_port = self._bind_tcp(self.router, s.port, "port")
        self.xpub = transport.mesh_xpub(ctx, self._max_frame, curve, beats)
        self._sockets.append(self.xpub)
        self.pub_port = self._bind_tcp(self.xpub, s.pub_port, "pub_port")
        self.agents_sock = transport.agent_router(ctx, max(s.inbox_cap, 1), self._max_frame)
        self._sockets.append(self.agents_sock)
        self._bind_agent_socket(self.agents_sock)
        self.agents_monitor = self.agents_sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.started_at = time.monotonic()
        self.peer_table.start(ctx, reactor, self.router_endpoints(), self.pub_endpoints())
        self._build(self.agents_sock, reactor)
        check_uid = self.security.check_uid
        reactor.add(self.router, self.routing.on_mesh_checked if check_uid else self.routing.on_mesh,
                    copy=not check_uid)
        reactor.add(self.xpub, self.routing.on_xpub)
        reactor.add(self.agents_sock, self.routing.on_agent)
        reactor.add(self.agents_monitor, self.local_agents.on_monitor)

    def _build(self, agents_sock: zmq.Socket[Any], reactor: transport.Reactor,
               stays_attached: Callable[[bytes], bool] | None = None) -> None:
        """Build the parts that need the sockets, each given what it calls: the agent link, the
        qos-1 driver, meshctl's desk, agent control, then the router (which calls all of them).
        The driver and the desk route through ``_route``, since the router comes last."""
        s = self.settings
        assert self._qos_machine is not None
        link = AgentLink(agents_sock, reactor, self.node_id, backlog_max=s.agent_answer_backlog,
                         urgent_max=s.priority_hold_max, held_max=s.inbox_cap, stats=self.stats)
        self.qos = Qos1Driver(self._qos_machine, node_id=self.node_id, stats=self.stats,
                              outcomes=self.outcomes, qos1_ttl=s.qos1_ttl, link=link,
                              peer_table=self.peer_table, directory=self.directory,
                              dead_letters=self.dead_letter_fifo, route=self._route, shutdown=self.shutdown)
        self.admin = Admin(node_id=self.node_id, name=self.name, directory=self.directory,
                           peer_table=self.peer_table, dead_letters=self.dead_letter_fifo, link=link,
                           qos=self.qos, route=self._route, doctor=self._doctor_report,
                           mdns_query=self._mdns_query)
        self.local_agents = LocalAgents(
            s, node_id=self.node_id, name=self.name, directory=self.directory,
            peer_table=self.peer_table, link=link, plugins=self.plugins, stats=self.stats,
            node_info=self.node_info, qos=self.qos, admin=self.admin, updates=self.dir_updates,
            system_token=self._system_token, shutdown=self.shutdown,
            settled=lambda: peers_settled(self.peer_table), stays_attached=stays_attached)
        self.routing = Router(
            s, node_id=self.node_id, name=self.name, directory=self.directory,
            peer_table=self.peer_table, security=self.security, agents=self.local_agents, link=link,
            xpub=self.xpub, reactor=reactor, outcomes=self.outcomes, dead_letters=self.dead_letter_fifo,
            plugins=self.plugins, stats=self.stats, quiet=self._quiet, qos=self.qos, shutdown=self.shutdown)
        self.local_agents.handover.hold_registrations()  # answered at READY (meshd/delivery/handover.py)

    # Calls from parts to parts built after them, through the node (the PeerEvents pattern).

    def _route(self, to: str, header: P.Header, frames: list[bytes]) -> str | None:
        return self.routing.route(to, header, frames)

    def _evict_local(self, agent: LocalAgent, why: str) -> None:
        self.local_agents.evict(agent, why)

    def _peer_directory(self, peer: Peer, body: Any) -> None:
        self.dir_updates.received(peer, body)

    def _directory_body(self) -> dict[str, Any]:
        return self.dir_updates.snapshot()

    def _directory_version(self) -> int:
        return self.dir_updates.announced_version()

    def _doctor_report(self) -> dict[str, Any]:
        return daemon_report(self.settings, self.interfaces, self.peer_table,
                             {"router": self.router_port, "pub": self.pub_port},
                             self._discovery.heard() if self._discovery else [])

    def _mdns_query(self) -> bool:
        return self._discovery is not None and self._discovery.send_query()

    async def _start_discovery(self) -> None:
        s = self.settings
        if s.discovery:
            self._discovery = Discovery(
                node_id=self.node_id, mesh=s.mesh, name=self.name, interfaces=self.interfaces,
                router_port=self.router_port, pub_port=self.pub_port, proto=P.PROTOCOL_VERSION,
                on_found=self.peer_table.on_discovered, on_lost=self.peer_table.on_discovery_lost,
                pubkey=self.security.public_key, on_other_mesh=self.peer_table.on_discovered,
                connected=self.peer_table.online_ids, requery_max=s.discovery_requery_max,
                alone_warning_after=s.alone_warning_after,
            )
            await self._discovery.start()
        for endpoint in s.peers:
            self.peer_table.dial_static(endpoint)

    async def _start_timers(self) -> None:
        loops = self.timer_loops
        self._timer(loops.heartbeat_loop, "meshd-heartbeat")
        self._timer(loops.liveness_loop, "meshd-liveness")
        self._timer(loops.qos_loop, "meshd-qos1")
        if self.security.trust is not None and self.security.trust.mode == "keys":
            self._timer(loops.trust_loop, "meshd-trust")
        if self.settings.address_poll_interval > 0:  # follow address changes (meshd/daemon/address_watch.py)
            watcher = AddressWatcher(
                self.settings, self.interfaces, router=self.router, xpub=self.xpub,
                peer_table=self.peer_table, discovery=lambda: self._discovery,
                ports=lambda: (self.router_port, self.pub_port),
                defaults=default_interfaces)
            self._timer(watcher.run, "meshd-addresses")
        self._take_snapshot()

    async def _start_plugins(self) -> None:
        s = self.settings
        log.info(
            "node %s (%s) mesh=%r router=%s pub=%s agents=%s%s", self.node_id, self.name, s.mesh,
            self.router_endpoints(), self.pub_endpoints(), self.socket_path,
            " INSECURE (plaintext mesh)" if s.insecure else "",
        )
        self._track_outcomes()
        await self.plugins.startup(self)
        self.plugins.start()

    async def _start_gateway(self) -> None:
        if self.settings.http:
            from meshd.gateway import Gateway  # lazily: aiohttp only in a daemon that serves HTTP

            self.gateway = Gateway(self.settings, self)
            await self.gateway.start()

    async def _start_system(self) -> None:
        from meshd.tools.service import SystemAgent

        self.system = SystemAgent(self, self._system_token)
        await self.system.start()
        self.ready.set()
        self.local_agents.handover.ready()
        self.notifier.ready(self.status_line())
        self._timer(self.timer_loops.status_loop, "meshd-status")

    def _timer(self, loop: Callable[[], Awaitable[None]], name: str) -> None:
        """Start a background loop, supervised: restarted if it raises (meshd/util/supervise.py)."""
        self._timers.append(asyncio.create_task(supervised(loop, name, self.stats, self._quiet), name=name))

    def _bind_tcp(self, sock: zmq.Socket[Any], port: int, key: str) -> int:
        """Bind a mesh socket on every interface; an address this host does not have is a config
        error (exit 2: restarting cannot give the host that address), a port in use is not."""
        try:
            return transport.bind_tcp(sock, self.interfaces, port)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError("interfaces", f"{', '.join(self.interfaces)}: not (all) addresses of "
                                  "this host (fix: --interface with an address `ip -4 addr` lists, or "
                                  "leave it unset to follow the host's addresses)") from None
            if exc.errno == errno.EACCES:
                raise ConfigError(key, f"port {port} needs privileges this user lacks "
                                  "(fix: a port above 1023, or 0 for any free one)") from None
            raise

    def _bind_agent_socket(self, sock: zmq.Socket[Any]) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        if path.exists():
            if not stat.S_ISSOCK(path.stat().st_mode):
                raise StartupError("sockets", f"{path} exists and is not a socket")
            if _socket_in_use(path):
                raise StartupError("sockets", f"another meshd is serving {path}")
            path.unlink()
        old_umask = os.umask(0o117)  # the socket file is created 0660, never world-accessible
        try:
            sock.bind(f"ipc://{path}")
            self._socket_bound = True
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o660)

    async def stop(self) -> None:
        """Run ``STOP_STEPS`` in order: drain and leave, close sockets (bounded linger)."""
        if self._stopping:
            return
        self._stopping = True
        self.shutdown.begin()  # every part reads it (peers, qos 1, agent control, routing)
        local_agents = getattr(self, "local_agents", None)
        if local_agents is not None:
            local_agents.handover.begin()  # DAEMON_STOPPING to each agent: it holds its sends
        for step in STOP_STEPS:
            try:
                await getattr(self, f"_stop_{step}")()
            except Exception:
                log.exception("shutdown step %s failed", step)
        log.info("node %s stopped", self.node_id)

    async def _stop_gateway(self) -> None:
        self.notifier.stopping(f"stopping: {self.status_line()}")
        if self.gateway is not None:
            await self.gateway.stop()

    async def _stop_system(self) -> None:
        if self.system is not None:
            await self.system.stop()

    async def _stop_plugins(self) -> None:
        if self.ready.is_set():
            await self.plugins.shutdown(self)

    async def _stop_timers(self) -> None:
        for task in self._timers:
            task.cancel()
        for task in self._timers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_discovery(self) -> None:
        if getattr(self, "peer_table", None) is not None:  # absent if the identity step failed
            self.peer_table.say_bye()
        if self._discovery is not None:
            await self._discovery.stop()

    async def _stop_sockets(self) -> None:
        if getattr(self, "local_agents", None) is not None:  # read the agents' last words, answer them
            await self.local_agents.handover.finish(self.agents_sock, self.routing.on_agent)
        if self._reactor is not None:
            self._reactor.close()
        if self.store is not None:
            try:
                self.store.close()
            except Exception:
                log.exception("closing the delivery store failed")
        self.security.close()
        if self._ctx is not None:
            self.peer_table.close()
            # A start that failed half-way may not have made every socket: close what exists.
            if self.agents_sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self.agents_sock.disable_monitor()
            monitor = getattr(self, "agents_monitor", None)
            if monitor is not None:
                monitor.close(0)
            for sock in self._sockets:
                sock.close(transport.LINGER_MS)
            self._ctx.term()
        if self._socket_bound:  # never remove another daemon's socket after a failed start
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    async def _stop_workers(self) -> None:
        self.notifier.close()
        self.plugins.stop()

    async def serve(self, shutdown_trigger: asyncio.Future[Any] | asyncio.Event) -> None:
        """Start, run until the trigger fires, stop. Tests stop a node without signals."""
        try:
            await self.start()
        except BaseException:
            await self.stop()  # release what a half-finished start bound (socket file, context)
            raise
        try:
            if isinstance(shutdown_trigger, asyncio.Event):
                await shutdown_trigger.wait()
            else:
                await shutdown_trigger
        finally:
            await self.stop()

    # ----------------------------------------------------------------------------- endpoints

    def router_endpoints(self) -> list[str]:
        return [f"tcp://{a}:{self.router_port}" for a in self.interfaces]

    def pub_endpoints(self) -> list[str]:
        return [f"tcp://{a}:{self.pub_port}" for a in self.interfaces]

    # ----------------------------------------------------------------------------- peer events

    def _peer_state_changed(self, peer: Peer, old: PeerState, new: PeerState) -> None:
        self.plugins.peer_state({"node": peer.node_id, "name": peer.name, "state": str(new),
                                 "router": peer.connected_router}, str(old), str(new))
        if new is PeerState.OFFLINE:
            self.directory.drop_node(peer.node_id)

    def _peer_restarted(self, peer: Peer) -> None:
        self.directory.drop_node(peer.node_id)
        self.qos.peer_restarted(peer.node_id)

    def _peer_acks(self, ids: list[str]) -> None:
        self.qos.acks_arrived(ids)

    def _peer_nacks(self, ids: list[str], error: dict[str, Any]) -> None:
        self.qos.nacked(ids, error)

    def _reject_control(self, exc: FrameError, frames: list[bytes], origin: str) -> None:
        self.routing.reject(exc, frames, origin=origin)

    def _on_topic(self, frames: list[bytes]) -> None:
        self.routing.on_topic(frames)

    def _telemetry(self) -> dict[str, Any]:
        return self.local_agents.telemetry()

    def apply_trust_change(self) -> None:
        """Cut off peers whose key is no longer trusted; dial discovered ones that now are."""
        self.peer_table.apply_trust_change()

    def status_line(self) -> str:
        """One line for systemd's STATUS= and logs: peers and agents counted."""
        if getattr(self, "peer_table", None) is None:  # the identity step did not finish
            return "not started"
        return self.timer_loops.status_line()

    # ----------------------------------------------------------------------------- queries

    def node_info(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "name": self.name,
            "mesh": self.settings.mesh,
            "routers": self.router_endpoints(),
            "pubs": self.pub_endpoints(),
            "socket": str(self.socket_path),
            "insecure": self.settings.insecure,
            "trust_mode": None if self.settings.insecure else self.settings.trust_mode,
            "public_key": self.security.public_key,
            "auth": self.security.stats(),
            "uptime": round(time.monotonic() - self.started_at, 3),
            "agents": self.directory.own_count(),
            "peers": self.peer_table.online_count(),
            "stats": dict(self.stats),
            "dead_letters": self.dead_letter_fifo.total,
            "plugins": {"stats": dict(self.plugins.stats), "queued": self.plugins.queued,
                        "queues": self.plugins.queue_depths(),
                        "hook_time": self.plugins.hook_times(),
                        "loaded": [p["name"] for p in self.plugins.list_plugins()
                                   if p["status"] == "loaded"]},
            "qos1": self.qos.info(),
            "discovery": ({"heard": len(self._discovery.heard()), "requeries": self._discovery.requeries,
                           "alone_warnings": self._discovery.alone_warnings}
                          if self._discovery is not None else None),
        }

