"""The daemon's publish path: fan-out, a peer's publications, gap notices, INBOX_FULL to publishers.

Owns: ``Publications.publish`` (PUB/SUB for everyone, and for a qos-1 publication one outbox unit
per durable subscriber), ``Publications.on_topic`` (a peer's publication to the local
subscribers), handing a publication to one local subscriber (``Publications.deliver``: at once,
or into the ``PublicationHold`` it composes, meshd/delivery/publication_hold.py, while that subscriber's inbox
is full; dropped only past the hold's bounds), the gap notices (``Publications.missed`` sums what
was dropped per subscriber and topic into one PUBLICATIONS_MISSED, soon) and the INBOX_FULL
notice to a publisher (``Publications.publication_dropped``: with ``held`` a pause before
anything is lost, repeated by ``Publications._remind`` while its publications wait for a
subscriber that is reading; without ``held`` a loss; rate-limited, the publishers remembered
bounded by the config's ``publisher_notices_max``).

Must not touch: the edge checks and routing decisions (routing.py: the ``Router`` composes this
and is the one way out, ``Router.route`` and ``Router.refuse``), peer state, agent records (it
reads the directory), the outbox (it asks the ``Qos1Driver``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from meshd.delivery.publication_hold import PublicationHold
from meshd.mesh.directory import LocalAgent
from meshd.util.priority import priority_of
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind

if TYPE_CHECKING:
    from meshd import transport
    from meshd.config.settings import Settings
    from meshd.delivery.local_agents import AgentLink
    from meshd.delivery.qos1_driver import Qos1Driver
    from meshd.mesh.directory import Directory

DROP_NOTICE_S = 0.1
"""A publisher whose publications a full subscriber inbox dropped hears INBOX_FULL at most this
often (its client pauses publishing that long)."""
HELD_NOTICE_S = 0.15
"""A publisher whose publications wait in a full subscriber's hold (meshd/delivery/publication_hold.py) hears
INBOX_FULL with ``held`` at most this often, and its client pauses publishing that long."""
HELD_REMIND_S = 0.05
"""While a publisher's publications wait for a subscriber that is reading, it hears the notice
again this often (well under HELD_NOTICE_S, so its pause goes on without a gap even when a
notice takes 0.1 s to arrive on a busy machine) and stays paused until they are out..."""
HELD_READING_S = 1.0
"""...as long as that subscriber's hold began, or last sent one out, this recently (a ZeroMQ pipe
frees room in bursts, every few hundred messages read); one that reads nothing for longer stops
holding its publishers up (they run into its bound and it misses publications, as before)."""
GAP_NOTICE_DELAY = 0.05
"""Seconds over which missed publications are summed into one gap notice per topic."""
OUTBOX_RETRY_AFTER = 1.0
"""Seconds an OUTBOX_FULL refusal suggests waiting before a retry."""


def _publications_in(msg: list[bytes]) -> int:
    """How many publications a refused publication message holds: 1, or a publishing batch's
    members (decoded only here, on the drop path)."""
    try:
        if P.unpack_header(msg[1]).get(P.KIND) != Kind.BATCH:
            return 1
        return max(len(P.split_batch(msg)), 1)
    except (FrameError, TypeError, IndexError):
        return 1


def _held_info(msg: list[bytes]) -> tuple[int, str, int]:
    """How many publications a message about to be held counts for (1, or a publishing batch's
    ``count``: its header only, clamped to 1..MAX_BATCH, the bytes bound holds whatever it says),
    its publisher ("" if unreadable) and its priority."""
    try:
        header = P.unpack_header(msg[1])
    except (FrameError, IndexError):
        return 1, "", P.DEFAULT_PRIORITY
    count = header.get(P.COUNT) if header.get(P.KIND) == Kind.BATCH else 1
    publisher = header.get(P.FROM)
    return (min(max(count, 1), P.MAX_BATCH) if isinstance(count, int) else 1,
            publisher if isinstance(publisher, str) else "", priority_of(header.get(P.PRIO)))


@dataclass(frozen=True)
class PublishRouting:
    """What the publish path asks of the router it belongs to (given at construction)."""

    #: Route a message (a notice to a publisher) as any other: ``Router.route``.
    route: Callable[[str, P.Header, list[bytes]], str | None]
    #: Refuse an agent's frame set with an error answer: ``Router.refuse``.
    refuse: Callable[..., None]


class Publications:
    """The publish path of one daemon; built and owned by its ``Router``."""

    def __init__(self, settings: Settings, *, node_id: str, directory: Directory, link: AgentLink,
                 qos: Qos1Driver, xpub: zmq.Socket[Any], reactor: transport.Reactor, stats: Counter[str],
                 routing: PublishRouting) -> None:
        self.settings = settings
        self.node_id = node_id
        self.directory = directory
        self.link = link
        self.qos = qos
        self.xpub = xpub
        self.reactor = reactor
        self.stats = stats
        self.routing = routing
        # (publisher, held) -> monotonic time of its next notice (DROP_NOTICE_S, HELD_NOTICE_S)
        self._drop_notice_until: dict[tuple[str, bool], float] = {}
        self._gaps: dict[tuple[bytes, str], int] = {}  # (subscriber connection, topic) -> missed
        self._gap_timer: asyncio.TimerHandle | None = None
        # publisher -> (publication id, topic, subscriber) of its last held one, for reminders
        self._held_last: dict[str, tuple[str, str, str]] = {}
        self._remind_timer: asyncio.TimerHandle | None = None
        s = settings
        self.hold = PublicationHold(link, stats, per_subscriber_max=s.publish_hold_max,
                                    max_bytes=s.publish_hold_max_bytes,
                                    connected=lambda rid: rid in directory.local_by_rid)

    def deliver(self, sub: LocalAgent, topic: str | bytes, msg: list[bytes]) -> bool:
        """Hand a publication (or publishing batch) to the local subscriber ``sub``: at once if its
        inbox takes it and nothing is held for it; else held (meshd/delivery/publication_hold.py: it goes out
        in order as the subscriber reads) and its publisher asked to pause (INBOX_FULL with
        ``held``); only past the hold's bounds dropped, with a gap notice. ``topic``: the topic, or
        its key (on a peer's publication). True if it was delivered or held."""
        rid = sub.rid
        hold = self.hold
        if (not hold.waiting(rid) or hold.flush_one(rid)) and not self.link.has_backlog(rid):
            try:
                self.link.send_now([rid, *msg])
                sub.work_sent += 1
                return True
            except zmq.Again:
                pass  # the inbox is full: hold it
            except zmq.ZMQError:
                return self._drop(sub, topic, msg)  # the connection is gone
        count, publisher, priority = _held_info(msg)
        if hold.offer(rid, msg, count, publisher, priority):
            self.publication_dropped(sub.name, msg, held=hold.waiting(rid))
            return True
        return self._drop(sub, topic, msg)

    def _drop(self, sub: LocalAgent, topic: str | bytes, msg: list[bytes]) -> bool:
        self.stats["publish_local_dropped"] += 1
        name = topic if isinstance(topic, str) else topic[:-1].decode("utf-8", "replace")
        self.missed(sub, name, _publications_in(msg))
        self.publication_dropped(sub.name, msg)
        return False

    def publish(self, agent: LocalAgent, topic: str, header: P.Header, msg: list[bytes]) -> None:
        """Fan a publication out: PUB/SUB for everyone, and for a qos-1 publication one outbox
        unit per durable subscriber (who then gets it only that way, exactly once)."""
        reached = 0
        durable: list[str] = []
        if header.qos == 1:
            durable = self.directory.durable_subscribers(topic)
            unit_id = str(header.id)
            units: list[tuple[str, str, list[bytes]]] = []
            for name in durable:
                unit_header = dict(header.fields)
                unit_header[P.TO] = name
                unit_header[P.ID] = f"{unit_id}>{name}"
                units.append((name, unit_header[P.ID], [P.SIGNATURE, P.pack(unit_header), *msg[2:]]))
            for name, copy_id, copy in units:  # all copies or none
                full = self.qos.refusal(copy_id, name, copy)
                if full is not None:
                    self.routing.refuse(agent.rid, header, [agent.rid, *msg], P.ErrorCode.OUTBOX_FULL, full,
                                retry_after=OUTBOX_RETRY_AFTER)
                    return
            for name, copy_id, copy in units:
                self.qos.accept(None, agent.name, copy_id, name, copy)
            reached += len(durable)
        skip = set(durable)
        for sub in self.directory.local_subscribers(topic):
            if sub.name in skip:
                continue
            if self.deliver(sub, topic, msg):
                reached += 1
        local = self.directory.local
        remote = self.directory.remote_subscribers(topic) - sum(1 for n in durable if n not in local)
        if remote > 0:
            try:
                self.xpub.send_multipart([P.topic_key(topic), *msg], zmq.NOBLOCK)
                reached += remote
            except zmq.ZMQError:
                self.stats["publish_remote_dropped"] += 1
            self.reactor.kick(self.xpub)
        self.stats["published"] += 1
        ack = {P.KIND: Kind.OK, P.CORR: header.id, P.COUNT: reached}
        if durable:  # confirmed once the durable copies are on disk
            self.qos.after_flush(functools.partial(self.link.send, agent.rid, ack))
        else:
            self.link.send(agent.rid, ack)

    def on_topic(self, frames: list[bytes]) -> None:
        """A publication from a peer's XPUB: hand it to the local subscribers."""
        subs = self.directory.subscribers_of_key(frames[0])
        if not subs or len(frames) != 4 or frames[1] != P.SIGNATURE:  # [topic, SIG, header, payload]
            # also what a pattern's prefix subscription brought that none of our patterns matches
            self.stats["topic_dropped"] += 1
            return
        msg = frames[1:]
        qos1: bool | None = None
        for sub in list(subs):
            if sub.durable and qos1 is None:
                try:
                    qos1 = P.unpack_header(msg[1]).get(P.QOS) == 1
                except FrameError:
                    qos1 = False
            if qos1 and sub.durable_for(frames[0][:-1].decode("utf-8", "replace")):
                continue  # it gets its own qos-1 copy from the publisher's outbox
            self.deliver(sub, frames[0], msg)
        self.link.kick()

    def publication_dropped(self, subscriber: str, msg: list[bytes], held: int = 0) -> None:
        """A full inbox refused a qos-0 publication (or publishing batch). Dropped (``held`` 0):
        it is lost for that subscriber (counted by the caller); held (``held``: publications now
        waiting for that subscriber): nothing is lost yet. Either way tell its publisher
        INBOX_FULL with ``topic`` and ``retry_after`` (and ``held`` in the error map when held),
        at most once per DROP_NOTICE_S (HELD_NOTICE_S) for each, so its client slows down before
        the hold overflows, and instead of losing more in silence."""
        try:
            header = P.unpack_header(msg[1])
        except FrameError:
            return
        publisher, pub_id, topic = header.get(P.FROM), header.get(P.ID), header.get(P.TOPIC)
        if not isinstance(publisher, str) or not isinstance(pub_id, str) or not isinstance(topic, str):
            return
        if held:
            self._held_last.pop(publisher, None)
            self._held_last[publisher] = (pub_id, topic, subscriber)
            if len(self._held_last) > self.settings.publisher_notices_max:
                self._held_last.pop(next(iter(self._held_last)))
            if self._remind_timer is None:
                self._remind_timer = asyncio.get_running_loop().call_later(HELD_REMIND_S, self._remind)
        self._notice(publisher, pub_id, topic, subscriber, held)

    def _remind(self) -> None:
        """Tell again each publisher whose publications still wait for a subscriber that is
        reading (``PublicationHold.reading_publishers``), so that it stays paused until they are
        out; forget the others."""
        self._remind_timer = None
        reading = self.hold.reading_publishers(HELD_READING_S)
        for publisher in list(self._held_last):
            if publisher not in reading:
                del self._held_last[publisher]
            elif held := self.hold.held_from(publisher):
                self._notice(publisher, *self._held_last[publisher], held, again=True)
        if self._held_last:
            self._remind_timer = asyncio.get_running_loop().call_later(HELD_REMIND_S, self._remind)

    def _notice(self, publisher: str, pub_id: str, topic: str, subscriber: str, held: int,
                again: bool = False) -> None:
        now = time.monotonic()
        key = (publisher, held > 0)
        if not again and now < self._drop_notice_until.get(key, 0.0):
            return
        pause = HELD_NOTICE_S if held else DROP_NOTICE_S
        self._drop_notice_until.pop(key, None)
        self._drop_notice_until[key] = now + pause
        if len(self._drop_notice_until) > self.settings.publisher_notices_max:
            self._drop_notice_until.pop(next(iter(self._drop_notice_until)))
        what = (f"{held} publication(s) wait for it at its daemon: pause" if held
                else f"publications on {topic!r} were dropped")
        err = P.error_header(publisher, pub_id, P.ErrorCode.INBOX_FULL,
                             f"inbox of subscriber {subscriber!r} is full: {what}", retry=True,
                             retry_after=pause, sender=f"meshd@{self.node_id}", notice=True)
        err[P.TOPIC] = topic
        if held:
            err[P.ERROR]["held"] = held
            self.stats["publish_pause_notices"] += 1
        self.routing.route(publisher, P.header_from_map(err), P.frames(err))

    def missed(self, sub: LocalAgent, topic: str, count: int = 1) -> None:
        """``sub``'s inbox refused ``count`` publications on ``topic`` (a publishing batch holds
        several): count them (per topic), and tell the subscriber how many it missed in one gap
        notice per topic, soon (coalesced)."""
        self.stats[f"publish_missed:{topic}"] += count
        key = (sub.rid, topic)
        self._gaps[key] = self._gaps.get(key, 0) + count
        if self._gap_timer is None:
            self._gap_timer = asyncio.get_running_loop().call_later(GAP_NOTICE_DELAY, self._send_gaps)

    def _send_gaps(self) -> None:
        self._gap_timer = None
        gaps, self._gaps = self._gaps, {}
        for (rid, topic), count in gaps.items():
            agent = self.directory.local_by_rid.get(rid)
            if agent is None:
                continue  # it left
            err = P.error_header(agent.name, None, P.ErrorCode.PUBLICATIONS_MISSED,
                                 f"missed {count} publication(s) on topic {topic!r}: your inbox was full",
                                 sender=f"meshd@{self.node_id}", notice=True)
            err[P.ERROR].update(topic=topic, missed=count)
            self.link.send(rid, err)  # the answer lane: ahead of later publications
