"""The bridge: this site's mesh and the others', joined through NATS (docs/sites.md).

Attached to the local daemon as agents: ``main`` (announces, serves, forwards publications) and
one proxy agent per name that remote agents have here (``name:site``, and the plain name when
unambiguous). A message to a proxy crosses NATS to the bridge of the proxy's site, which hands it
to its daemon through the proxy of the sender (so the receiver, and its ``meshd_authorize``, see
the sender as ``name:site``) and sends any answer back on the request's inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from meshd.bindings.nats import envelope as E
from meshd.bindings.nats.directory import ProxyName, RemoteDirectory
from meshd.bindings.nats.subjects import Subjects, cover, qualified, split_qualified
from meshd.client import DEFER, Agent
from meshd.client.handlers import ANY_TOPIC, Message
from meshd.errors import ERRORS_BY_CODE, MeshError, Nack, ValidationFailed, error_from_wire
from meshd.util.backoff import backoff_delay
from meshd.wire import protocol as P
from meshd.wire.system_names import SYSTEM_PREFIX

__all__ = ["BRIDGE_META", "Bridge", "BridgeOptions"]

log = logging.getLogger("meshd.bridge")

BRIDGE_META: Final = "bridge_site"
"""Metadata key of every agent a bridge registers: its value is the site the agent stands for."""
NO_RESPONDERS: Final = "503"
HOP_LIMIT: Final = 5
DEFAULT_TIMEOUT: Final = 30.0
QOS1_LINK_WAIT: Final = 20.0  # seconds a qos-1 send waits for a lost NATS link before it is nacked
STATS_TOPIC: Final = "bridge.stats"
CLOSE_STEP: Final = 3.0  # seconds one step of close may take
ANSWERS_QUEUED: Final = 256  # progress notes held for one request awaiting its reader
RECENT_PUBLICATIONS: Final = 4096  # ids of publications from NATS remembered to drop second copies
DEAD_LETTER_REASON: Final = "JETSTREAM_MAX_DELIVER"
"""The reason of a qos-1 send from another site this site's daemon could not take in time."""
QOS1_BACKOFF_BASE: Final = 1.0  # a refused qos-1 delivery waits backoff_delay(n, 1 s, 30 s)...
QOS1_BACKOFF_CAP: Final = 30.0  # ...before JetStream delivers it again, unless the daemon said how long
FINAL_REFUSALS: Final = frozenset({"VALIDATION_FAILED", "TOO_LARGE", "FORBIDDEN"})
"""Refusals that no redelivery changes: dead letters at once."""


@dataclass(frozen=True, slots=True)
class BridgeOptions:
    site: str
    servers: list[str]
    socket: Path | None = None
    name: str | None = None
    prefix: str = "meshd"
    announce_interval: float = 1.0
    hold: float = 10.0  # a site not announced for this long is forgotten
    max_sites: int = 64
    max_remote_agents: int = 256
    max_topics: int = 256
    max_in_flight: int = 256  # requests from other sites being served at once
    max_bytes: int = P.DEFAULT_MAX_PAYLOAD_BYTES + 16 * 1024
    jetstream: bool = True
    stream_max_msgs: int = 1_000_000
    stream_max_bytes: int = 1 << 30
    max_deliver: int = 10
    ack_wait: float = 30.0
    creds: Path | None = None
    tls_ca: Path | None = None
    js_domain: str | None = None  # the hub's JetStream domain, for a bridge on a leaf node

    @property
    def agent_name(self) -> str:
        return self.name or f"bridge-{self.site}"


class ProxyAgent(Agent):
    """A remote agent's name here: it advertises the remote agent's contracts (so ``describe``,
    ``check=True``, the tools, MCP and A2A see what it accepts) and forwards every topic."""

    def __init__(self, name: str, contracts: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._remote_contracts = contracts

    def contracts(self) -> list[dict[str, Any]]:
        return list(self._remote_contracts)


class Bridge:
    """One site's bridge: :meth:`start`, then it runs until :meth:`close`."""

    def __init__(self, opts: BridgeOptions) -> None:
        self.opts = opts
        self.site = opts.site
        self.subjects = Subjects(opts.prefix)
        self.remote = RemoteDirectory(opts.site, hold=opts.hold, max_sites=opts.max_sites,
                                      max_agents=opts.max_remote_agents)
        self.main = Agent(opts.agent_name, socket=opts.socket, metadata={BRIDGE_META: opts.site})
        self.proxies: dict[str, ProxyAgent] = {}  # name here -> its agent
        self.proxy_of: dict[str, ProxyName] = {}
        self.serving: dict[str, asyncio.Task[None]] = {}  # crossing id -> its task
        self.local_topics: dict[str, Any] = {}  # topics local agents subscribe to -> NATS subscription
        self.exported: set[str] = set()  # topics this bridge subscribes to locally for other sites
        self.stats: dict[str, int] = {"crossed_out": 0, "crossed_in": 0, "answers": 0, "refused_input": 0,
                                      "no_responders": 0, "timeouts": 0, "busy": 0, "loops_dropped": 0,
                                      "published_out": 0, "published_in": 0, "js_acked": 0, "js_nacked": 0,
                                      "js_terminated": 0, "proxies_refused": 0,
                                      "answers_dropped": 0, "link_lost": 0,
                                      "announced_without_contracts": 0, "published_twice_dropped": 0,
                                      "js_dead_lettered": 0}
        self._last_refusal: dict[str, str] = {}  # qos-1 id -> the daemon's last refusal of it
        self._recent_pubs: OrderedDict[str, None] = OrderedDict()
        self.nc: Any = None
        self.js: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._closed = False
        #: Requests this site sent to others and awaits answers for: token -> its answers. One
        #: wildcard subscription serves them all (no SUB/UNSUB per request).
        self._answers: dict[str, asyncio.Queue[Any]] = {}
        self._inbox = ""
        self._link_up = asyncio.Event()  # the NATS connection is up (reconnects are nats-py's)

    # ------------------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        import nats

        kwargs: dict[str, Any] = {"servers": self.opts.servers, "name": self.opts.agent_name,
                                  "no_echo": True,  # what this bridge publishes never comes back to it
                                  # answers to this site only: NATS permissions can give each site
                                  # its own inboxes to subscribe to (docs/sites.md)
                                  "inbox_prefix": f"_INBOX.{self.site}",
                                  "max_reconnect_attempts": -1, "reconnect_time_wait": 0.5,
                                  "allow_reconnect": True, "disconnected_cb": self._link_lost,
                                  "reconnected_cb": self._link_back}
        if self.opts.creds is not None:
            kwargs["user_credentials"] = str(self.opts.creds)
        if self.opts.tls_ca is not None:
            import ssl

            kwargs["tls"] = ssl.create_default_context(cafile=str(self.opts.tls_ca))
        self.nc = await nats.connect(**kwargs)
        self._link_up.set()
        self.main.on(ANY_TOPIC)(self._local_publication)
        self.main.on(STATS_TOPIC)(self._stats)
        await self.main.connect()
        await self.nc.subscribe(self.subjects.agents_of(self.site), queue=f"bridge-{self.site}",
                                cb=self._from_nats)
        await self.nc.subscribe(self.subjects.cancel(self.site), cb=self._cancel_from_nats)
        self._inbox = self.nc.new_inbox()
        await self.nc.subscribe(self._inbox + ".*", cb=self._answer_arrived)
        await self.nc.subscribe(self.subjects.directories(), cb=self._announcement)
        if self.opts.jetstream:
            self.js = self.nc.jetstream(domain=self.opts.js_domain)
            self._tasks.append(asyncio.create_task(self._consume_qos1()))
        self._tasks.append(asyncio.create_task(self._directory_loop()))
        log.info("bridge of site %r on %s (agent %r)", self.site, ", ".join(self.opts.servers),
                 self.main.name)

    async def close(self) -> None:
        """Stops serving, then closes the agents (their names leave the directory) and NATS."""
        self._closed = True
        for task in self._tasks + list(self.serving.values()):
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, CLOSE_STEP)
        t0 = time.monotonic()
        await asyncio.gather(*(self._quietly(a.close()) for a in self.proxies.values()))
        self.proxies.clear()
        await self._quietly(self.main.close())
        if self.nc is not None:
            await self._quietly(self.nc.close())
        log.info("bridge of site %r closed in %.1f s", self.site, time.monotonic() - t0)

    @staticmethod
    async def _quietly(step: Any) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(step, CLOSE_STEP)

    async def _stats(self, _msg: Message) -> dict[str, Any]:
        """``meshctl request bridge-SITE bridge.stats``: the link, the sites, the counters."""
        now = time.monotonic()
        return {"site": self.site, "link": "up" if self._link_up.is_set() else "down",
                "servers": self.opts.servers, "jetstream": self.js is not None,
                "sites": {n: {"agents": len(s.agents), "heard_ago": round(now - s.heard, 3)}
                          for n, s in self.remote.sites.items()},
                "proxies": len(self.proxies), "serving": len(self.serving),
                "topics_in": len(self.local_topics), "topics_out": len(self.exported),
                "refused_sites": self.remote.refused_sites, "refused_agents": self.remote.refused_agents,
                **self.stats}

    async def _link_lost(self) -> None:
        self._link_up.clear()
        self.stats["link_lost"] += 1
        log.warning("NATS link of site %r lost: requests fail PEER_UNREACHABLE, qos-1 sends wait", self.site)

    async def _link_back(self) -> None:
        # What this site did not hear while it was cut off says nothing about the other sites:
        # each gets a full hold period to announce itself again.
        now = time.monotonic()
        for s in self.remote.sites.values():
            s.heard = now
        self._link_up.set()
        log.info("NATS link of site %r back", self.site)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------------------ directory

    def _is_ours(self, name: str) -> bool:
        return name == self.main.name or name in self.proxies

    async def _local_agents(self) -> list[dict[str, Any]]:
        rows = await self.main.agents()
        return [r for r in rows if not str(r.get("name", "")).startswith(SYSTEM_PREFIX)
                and BRIDGE_META not in (r.get("metadata") or {})]

    async def _directory_loop(self) -> None:
        while not self._closed:
            try:
                await self._directory_round()
            except MeshError as exc:
                log.warning("directory round: %s", exc.message)
            except Exception:  # one bad round never ends the bridge
                log.exception("directory round failed")
            await asyncio.sleep(self.opts.announce_interval)

    async def _directory_round(self) -> None:
        local = await self._local_agents()
        mine = [{"name": r["name"], "capabilities": list(r.get("capabilities") or [])[:32],
                 "topics": list(r.get("topics") or [])[:64],
                 "contracts": list(r.get("contracts") or [])[:E.MAX_CONTRACTS]} for r in local]
        if self.nc.is_connected:
            data = E.announcement(self.site, mine)
            if len(data) > self.nc.max_payload:  # contracts are what can make it big: without them
                self.stats["announced_without_contracts"] += 1
                data = E.announcement(self.site, [r | {"contracts": []} for r in mine])
            await self.nc.publish(self.subjects.directory(self.site), data)
        await self._follow_local_topics({t for r in mine for t in r["topics"]})
        if self._link_up.is_set():
            self.remote.expire(time.monotonic())
        await self._reconcile_proxies({str(r["name"]) for r in local})
        await self._follow_remote_topics(self.remote.topics())

    async def _announcement(self, m: Any) -> None:
        try:
            site, agents = E.unpack_announcement(m.data, self.opts.max_bytes)
        except ValidationFailed:
            self.stats["refused_input"] += 1
            return
        self.remote.apply(site, agents, time.monotonic())

    async def _reconcile_proxies(self, local: set[str]) -> None:
        wanted = self.remote.names(local)
        for name in [n for n in self.proxies if n not in wanted or self.proxies[n].evicted is not None
                     or self._contracts_of(wanted[n]) != self.proxies[n].contracts()]:
            # gone, evicted (a name conflict it lost), or its contracts changed: register anew
            agent = self.proxies.pop(name)
            self.proxy_of.pop(name, None)
            with contextlib.suppress(Exception):
                await agent.close()
        for name, where in wanted.items():
            if name in self.proxies:
                continue
            rec = self.remote.record(where.site, where.name) or {}
            # Capabilities on the qualified name only: a gather or a task by capability asks
            # each remote agent once, never again under its plain alias.
            caps = [] if where.alias else list(rec.get("capabilities") or [])
            agent = ProxyAgent(name, self._contracts_of(where), socket=self.opts.socket, capabilities=caps,
                               metadata={BRIDGE_META: where.site, "site": where.site,
                                         "remote_name": where.name, "alias": where.alias})
            agent.on(ANY_TOPIC)(self._forwarder(where, agent))
            try:
                await agent.connect()
            except MeshError as exc:  # NAME_TAKEN (a local agent has it): tried again next round
                self.stats["proxies_refused"] += 1
                log.info("proxy %r for %s of %s not registered: %s", name, where.name, where.site,
                         exc.message)
                with contextlib.suppress(Exception):
                    await agent.close()
                continue
            self.proxies[name] = agent
            self.proxy_of[name] = where

    def _contracts_of(self, where: ProxyName) -> list[dict[str, Any]]:
        rec = self.remote.record(where.site, where.name) or {}
        return list(rec.get("contracts") or [])

    async def _follow_local_topics(self, topics: set[str]) -> None:
        """NATS subscriptions for the topics local agents subscribe to, so publications of other
        sites on them reach this site (filtered by NATS, at the publisher's server)."""
        # Patterns covered by another (``news.today`` beside ``news.*``) would bring each of their
        # publications twice: only the widest are subscribed to.
        topics = set(sorted(cover(topics))[:self.opts.max_topics])
        for topic in [t for t in self.local_topics if t not in topics]:
            sub = self.local_topics.pop(topic)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for topic in topics - set(self.local_topics):
            self.local_topics[topic] = await self.nc.subscribe(self.subjects.topic_pattern(topic),
                                                               cb=self._publication_from_nats)

    async def _follow_remote_topics(self, topics: set[str]) -> None:
        """Local subscriptions (of ``main``) to the topics other sites' agents want (the daemon
        hands ``main`` each publication once, however many of them match it)."""
        topics = set(sorted(cover(topics))[:self.opts.max_topics])
        for topic in self.exported - topics:
            with contextlib.suppress(MeshError):
                await self.main.unsubscribe(topic)
            self.exported.discard(topic)
        for topic in topics - self.exported:
            await self.main.subscribe(topic)
            self.exported.add(topic)

    # ------------------------------------------------------------------------------ outbound

    def _forwarder(self, where: ProxyName, agent: Agent) -> Callable[[Message], Any]:
        async def forward(msg: Message) -> Any:
            return await self._forward(where, agent, msg)
        return forward

    def _sender_name(self, msg: Message) -> str:
        """The sender as the other site names it: ``name:site``; a remote agent relayed through
        this site keeps the qualified name it already has."""
        sender = msg.reply_to or msg.sender
        sender = sender.split("@", 1)[0]
        proxied = self.proxy_of.get(sender)
        if proxied is not None:
            return qualified(proxied.name, proxied.site)
        return qualified(sender, self.site)

    async def _forward(self, where: ProxyName, agent: Agent, msg: Message) -> Any:
        crossing = E.Crossing("request" if msg.is_request else "send", msg.id, self._sender_name(msg),
                              where.name, msg.topic, msg.payload, hops=msg.hops + 1, qos=msg.qos,
                              headers=dict(msg.headers), version=msg.schema_version)
        if crossing.hops > HOP_LIMIT:
            if msg.is_request:
                await self._fail(agent, msg, "HOP_LIMIT", f"more than {HOP_LIMIT} hops")
                return DEFER
            return None
        headers = {E.ORIGIN_HEADER: self.site}
        if not msg.is_request:
            if msg.qos == 1 and self.js is not None:
                with contextlib.suppress(TimeoutError):  # a NATS restart: wait for it, bounded
                    await asyncio.wait_for(self._link_up.wait(), QOS1_LINK_WAIT)
                try:  # acked to the daemon (the handler returns) only once JetStream has it
                    await self.js.publish(self.subjects.qos1(where.site, where.name), crossing.pack(),
                                          headers=headers | {"Nats-Msg-Id": msg.id}, timeout=5.0)
                except Exception as exc:
                    self.stats["js_nacked"] += 1
                    raise Nack(f"JetStream did not take it: {exc}", retry=True, retry_after=1.0) from None
            else:
                await self.nc.publish(self.subjects.agent(where.site, where.name), crossing.pack(),
                                      headers=headers)
            self.stats["crossed_out"] += 1
            return None
        if not self._link_up.is_set():
            await self._fail(agent, msg, "PEER_UNREACHABLE", f"the NATS link of site {self.site!r} is down")
            return DEFER
        left = msg.time_left if msg.time_left is not None else DEFAULT_TIMEOUT
        if left <= 0:
            await self._fail(agent, msg, "TIMEOUT", "the request's budget was spent before it left this site")
            return DEFER
        crossing = E.Crossing(crossing.kind, crossing.id, crossing.sender, crossing.to, crossing.topic,
                              crossing.payload, int(left * 1000), crossing.hops, 0, crossing.headers,
                              crossing.version)
        end = time.monotonic() + left
        token = os.urandom(12).hex()
        answers: asyncio.Queue[Any] = asyncio.Queue(ANSWERS_QUEUED)
        self._answers[token] = answers
        try:
            await self.nc.publish(self.subjects.agent(where.site, where.name), crossing.pack(),
                                  reply=f"{self._inbox}.{token}", headers=headers)
            self.stats["crossed_out"] += 1
            return await self._await_answer(agent, msg, where, answers, end)
        except asyncio.CancelledError:  # the requester cancelled: so does the other site
            if self.nc.is_connected:
                self._spawn(self.nc.publish(self.subjects.cancel(where.site), E.cancel(msg.id)))
            raise
        finally:
            self._answers.pop(token, None)

    async def _answer_arrived(self, m: Any) -> None:
        queue = self._answers.get(m.subject.rpartition(".")[2])
        if queue is None:
            return  # answered, timed out or cancelled already
        try:
            queue.put_nowait(m)
        except asyncio.QueueFull:  # a flood of progress notes: the reply still comes after them
            self.stats["answers_dropped"] += 1

    async def _await_answer(self, agent: Agent, msg: Message, where: ProxyName, answers: asyncio.Queue[Any],
                            end: float) -> Any:
        while True:
            remaining = end - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                m = await asyncio.wait_for(answers.get(), remaining)
            except TimeoutError:
                self.stats["timeouts"] += 1
                await self._fail(agent, msg, "TIMEOUT",
                                 f"no reply from {where.name!r} of site {where.site!r} in time")
                return DEFER
            if m.headers and m.headers.get("Status") == NO_RESPONDERS:
                self.stats["no_responders"] += 1
                await self._fail(agent, msg, "NO_SUCH_AGENT", f"no bridge of site {where.site!r} answers for "
                                 f"{where.name!r}")
                return DEFER
            try:
                kind, value = E.unpack_answer(m.data, self.opts.max_bytes)
            except ValidationFailed:
                self.stats["refused_input"] += 1
                continue
            if kind == E.ANSWER_PROGRESS:
                await msg.progress(value)
                continue
            self.stats["answers"] += 1
            if kind == E.ANSWER_REPLY:
                return value
            err = error_from_wire(value)
            await agent.fail(msg, err, code=err.code)
            return DEFER

    @staticmethod
    async def _fail(agent: Agent, msg: Message, code: str, text: str) -> None:
        await agent.fail(msg, ERRORS_BY_CODE.get(code, MeshError)(text), code=code)

    async def _local_publication(self, msg: Message) -> None:
        """A local publication on a topic other sites want: out to NATS, unless it came from
        NATS (published here by one of this bridge's agents)."""
        if msg.kind != P.Kind.PUBLISH or not self.nc.is_connected:
            return
        if self._is_ours(msg.sender.split("@", 1)[0]):
            self.stats["loops_dropped"] += 1
            return
        crossing = E.Crossing("publish", msg.id, self._sender_name(msg), "", msg.topic, msg.payload,
                              hops=msg.hops + 1, headers=dict(msg.headers), version=msg.schema_version)
        await self.nc.publish(self.subjects.topic(msg.topic), crossing.pack(),
                              headers={E.ORIGIN_HEADER: self.site})
        self.stats["published_out"] += 1

    # ------------------------------------------------------------------------------ inbound

    def _agent_for(self, sender: str) -> Agent:
        """The agent that hands a crossing to this site: the sender's proxy when it has one here."""
        return self.proxies.get(sender) or self.main

    def _decode(self, m: Any) -> E.Crossing | None:
        if (m.headers or {}).get(E.ORIGIN_HEADER) == self.site:
            self.stats["loops_dropped"] += 1
            return None
        try:
            c = E.unpack_crossing(m.data, self.opts.max_bytes)
        except ValidationFailed as exc:
            self.stats["refused_input"] += 1
            log.info("refused a message from NATS on %s: %s", m.subject, exc.message)
            return None
        if split_qualified(c.sender) is None:  # a sender always names its site (it may be this
            self.stats["refused_input"] += 1  # one: a request delegated back where it began)
            return None
        return c

    async def _from_nats(self, m: Any) -> None:
        c = self._decode(m)
        if c is not None and c.kind == "publish":  # publications have subjects of their own
            self.stats["refused_input"] += 1
            c = None
        if c is None:
            if m.reply:
                await self._answer(m.reply, E.ANSWER_ERROR,
                                   P.error_body("VALIDATION_FAILED", "refused by the bridge"))
            return
        self.stats["crossed_in"] += 1
        if c.kind == "request":
            if len(self.serving) >= self.opts.max_in_flight:
                self.stats["busy"] += 1
                await self._answer(m.reply, E.ANSWER_ERROR, P.error_body(
                    "INBOX_FULL", f"the bridge of site {self.site!r} serves {self.opts.max_in_flight} "
                    "requests already", retry=True, retry_after=0.5))
                return
            task = asyncio.create_task(self._serve(c, m.reply))
            self.serving[c.id] = task
            task.add_done_callback(functools.partial(self._served, c.id))
            return
        with contextlib.suppress(MeshError):
            await self._agent_for(c.sender).send(c.to, c.topic, c.payload, headers=c.headers or None,
                                                 version=c.version)

    def _served(self, key: str, _task: object) -> None:
        self.serving.pop(key, None)

    async def _serve(self, c: E.Crossing, reply: str) -> None:
        if c.hops > HOP_LIMIT:
            await self._answer(reply, E.ANSWER_ERROR,
                               P.error_body("HOP_LIMIT", f"more than {HOP_LIMIT} hops"))
            return
        timeout = c.budget_ms / 1000 if c.budget_ms else DEFAULT_TIMEOUT
        if timeout <= 0:
            await self._answer(reply, E.ANSWER_ERROR, P.error_body("TIMEOUT", "no budget left"))
            return

        def progress(note: str) -> None:
            self._spawn(self._answer(reply, E.ANSWER_PROGRESS, note))

        try:
            # hops go on counting here: the daemon's hop limit holds across sites
            result = await self._agent_for(c.sender).request(c.to, c.topic, c.payload, timeout=timeout,
                                                             headers=c.headers or None, on_progress=progress,
                                                             version=c.version, hops=c.hops)
        except MeshError as exc:
            await self._answer(reply, E.ANSWER_ERROR, P.error_body(
                exc.code, exc.message, retry=exc.retryable, retry_after=exc.retry_after,
                remote_type=exc.remote_type, fallback=exc.fallback, details=exc.details))
            return
        await self._answer(reply, E.ANSWER_REPLY, result)

    async def _answer(self, reply: str, kind: str, value: Any) -> None:
        if reply and self.nc.is_connected:
            with contextlib.suppress(Exception):
                await self.nc.publish(reply, E.answer(kind, value))

    async def _cancel_from_nats(self, m: Any) -> None:
        try:
            msg_id = E.unpack_cancel(m.data)
        except ValidationFailed:
            self.stats["refused_input"] += 1
            return
        task = self.serving.get(msg_id)
        if task is not None:
            task.cancel()  # the mesh request is cancelled: its handler hears it

    async def _publication_from_nats(self, m: Any) -> None:
        c = self._decode(m)
        if c is None or c.kind != "publish":
            return
        if c.hops > HOP_LIMIT:
            self.stats["loops_dropped"] += 1
            return
        if not self._first_copy(c.id):  # two of this bridge's NATS subscriptions matched it
            self.stats["published_twice_dropped"] += 1
            return
        self.stats["published_in"] += 1
        with contextlib.suppress(MeshError):
            await self._agent_for(c.sender).publish(c.topic, c.payload, headers=c.headers or None,
                                                    version=c.version)

    def _first_copy(self, pub_id: str) -> bool:
        """False for a publication seen already: NATS gives a connection one copy per matching
        subscription, and overlapping patterns (``a.*.c``, ``a.b.*``) both match ``a.b.c``. The
        ids remembered are bounded (``RECENT_PUBLICATIONS``, oldest forgotten first): the copies
        of one publication come back to back, within a few messages of each other."""
        if pub_id in self._recent_pubs:
            return False
        self._recent_pubs[pub_id] = None
        if len(self._recent_pubs) > RECENT_PUBLICATIONS:
            self._recent_pubs.popitem(last=False)
        return True

    # ------------------------------------------------------------------------------ qos 1

    async def _ensure_stream(self) -> None:
        from nats.js.api import RetentionPolicy, StorageType, StreamConfig
        from nats.js.errors import BadRequestError

        config = StreamConfig(name=self.subjects.stream_name(), subjects=[self.subjects.qos1_all()],
                              retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
                              max_msgs=self.opts.stream_max_msgs, max_bytes=self.opts.stream_max_bytes,
                              duplicate_window=120.0)
        try:
            await self.js.add_stream(config)
        except BadRequestError:  # it exists (another site's bridge made it)
            await self.js.update_stream(config)

    async def _consume_qos1(self) -> None:
        """This site's qos-1 sends from JetStream into the daemon; each acked to JetStream only
        once the daemon has it on disk (``send(qos=1)`` returned), so a crash redelivers it."""
        import nats.errors
        from nats.js.api import AckPolicy, ConsumerConfig

        durable = f"q1-{self.site}"
        # One delivery more than --max-deliver: the extra one files as a dead letter what the
        # last try left unanswered (this bridge died holding it), never tried again.
        config = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                                ack_wait=self.opts.ack_wait, max_deliver=self.opts.max_deliver + 1,
                                filter_subject=self.subjects.qos1_of(self.site))
        psub = None
        while psub is None:  # JetStream may come later than NATS (a hub still starting, a leaf cut off)
            try:
                await self._ensure_stream()
                psub = await self.js.pull_subscribe(self.subjects.qos1_of(self.site), durable=durable,
                                                    stream=self.subjects.stream_name(), config=config)
            except Exception as exc:
                log.warning("qos-1 consumer not ready: %s", exc)
                await asyncio.sleep(1.0)
        while True:
            try:
                batch = await psub.fetch(64, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            except Exception as exc:  # NATS down: the consumer is durable, fetch again later
                log.info("qos-1 fetch: %s", exc)
                await asyncio.sleep(0.5)
                continue
            for m in batch:
                await self._qos1_in(m)

    async def _qos1_in(self, m: Any) -> None:
        c = self._decode(m)
        if c is None or c.kind != "send":
            self.stats["js_terminated"] += 1
            with contextlib.suppress(Exception):
                await m.term()
            return
        delivered = _delivery_count(m)
        if delivered > self.opts.max_deliver:
            # The delivery JetStream allows past --max-deliver: the last try ended without an
            # answer (this bridge died, or its ack was lost), so it is not tried again.
            await self._dead_letter(m, c, delivered - 1, self._last_refusal.pop(c.id, "no answer"))
            return
        agent = self._agent_for(c.sender)
        try:
            # The id it had at its own site: a redelivery by JetStream (this bridge died before its
            # ack) is the same unit to the daemon and the receiving agent, which handle it once.
            await agent.send(c.to, c.topic, c.payload, qos=1, headers=c.headers or None,
                             version=c.version, msg_id=c.id)
        except MeshError as exc:
            self.stats["js_nacked"] += 1
            if delivered >= self.opts.max_deliver or (not exc.retryable and exc.code in FINAL_REFUSALS):
                await self._dead_letter(m, c, delivered, exc.code)
                return
            self._remember_refusal(c.id, exc.code)
            delay = exc.retry_after or backoff_delay(delivered, QOS1_BACKOFF_BASE, QOS1_BACKOFF_CAP)
            log.info("qos-1 %s to %r not taken by the daemon (%s, delivery %d of %d): again in %.1f s", c.id,
                     c.to, exc.code, delivered, self.opts.max_deliver, delay)
            with contextlib.suppress(Exception):
                await m.nak(delay=delay)
            return
        self._last_refusal.pop(c.id, None)
        self.stats["crossed_in"] += 1
        self.stats["js_acked"] += 1
        with contextlib.suppress(Exception):
            await m.ack_sync()

    def _remember_refusal(self, msg_id: str, code: str) -> None:
        self._last_refusal[msg_id] = code
        if len(self._last_refusal) > RECENT_PUBLICATIONS:  # bounded: the oldest forgotten
            self._last_refusal.pop(next(iter(self._last_refusal)))

    async def _dead_letter(self, m: Any, c: E.Crossing, attempts: int, last: str) -> None:
        """A qos-1 send this site could not take in ``attempts`` deliveries: into the daemon's
        dead letters (reason ``JETSTREAM_MAX_DELIVER``, listable and replayable with meshctl,
        the sender its proxy ``name:site``), then out of the stream. If the daemon cannot file
        it either, it stays in the stream unacked (JetStream delivers it once more, at most)."""
        from meshd.wire.payloads import encode_payload

        detail = (f"qos-1 send from {c.sender} to {c.to!r} on {c.topic!r}: site {self.site!r} could not "
                  f"hand it to its daemon in {attempts} JetStream deliveries (last: {last})")
        try:
            await self._agent_for(c.sender).admin(
                "deadletters.file", reason=DEAD_LETTER_REASON, detail=detail[:1000], to=c.to, topic=c.topic,
                payload=encode_payload(c.payload), qos=1, attempts=attempts, id=c.id,
                headers=c.headers or None)
        except MeshError as exc:
            log.warning("qos-1 %s not filed as a dead letter (%s): left in JetStream", c.id, exc.message)
            return
        self._last_refusal.pop(c.id, None)
        self.stats["js_dead_lettered"] += 1
        log.warning("dead letter: %s", detail)
        with contextlib.suppress(Exception):
            await m.term()


def _delivery_count(m: Any) -> int:
    """Which delivery of its message ``m`` is (1 the first), from its JetStream metadata."""
    with contextlib.suppress(Exception):
        return max(1, int(m.metadata.num_delivered))
    return 1
