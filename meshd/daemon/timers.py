"""The daemon's timers: what each periodic loop does (node.py starts them, each one supervised).

Owns: the loops' bodies: qos-1 retries (``TimerLoops.qos_loop``, which also expires outcomes,
rebuilds the metrics snapshot every second and runs the outbox housekeeping every minute), the
peer heartbeats, the liveness checks, the trust-folder reload, and systemd's STATUS= and
WATCHDOG=1 (``TimerLoops.status_loop``, ``TimerLoops.status_line``).

Must not touch: starting or stopping the tasks (node.py's ``timers`` steps), or any part's state:
each loop only calls the parts the node built.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshd.daemon.node import Node


class TimerLoops:
    """The node's periodic loops; each reads the node's parts when it runs (built later)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def qos_loop(self) -> None:
        n = self.node
        ticks = 0
        while True:
            await asyncio.sleep(0.05)
            n.qos.tick()
            ticks += 1
            if n.outcomes.inflight and ticks % 20 == 0:
                n.outcomes.expire()
            if ticks % 20 == 0:  # every second
                n._take_snapshot()
            if ticks % 1200 == 0:  # every minute
                n.qos.housekeeping(n.settings.qos1_ack_timeout)

    async def heartbeat_loop(self) -> None:
        n = self.node
        while True:
            n.peer_table.beat()
            await asyncio.sleep(n.settings.heartbeat_interval)

    async def liveness_loop(self) -> None:
        n = self.node
        tick = min(0.25, n.settings.heartbeat_interval / 2)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            n.peer_table.check_liveness(now)
            n.local_agents.check_liveness(now)

    async def trust_loop(self) -> None:
        """Apply changes to the authorized-keys folder without a restart."""
        n = self.node
        while True:
            await asyncio.sleep(1.0)
            try:
                changed = n.security.reload()
            except OSError as exc:
                n._quiet.log(f"trust:{exc}", "cannot read authorized keys: %s", exc)
                continue
            if changed:
                n.apply_trust_change()

    def status_line(self) -> str:
        """One line for systemd's STATUS= and logs: peers and agents counted."""
        n = self.node
        clones = n.peer_table.clones
        alarm = (f"DUPLICATE NODE ID {n.node_id} (cloned state dir? meshd reset-identity); "
                 if clones.self_duplicate else "")
        alarm += f"duplicate peer ids: {', '.join(clones.found)}; " if clones.found else ""
        return (f"{alarm}{n.peer_table.online_count()}/{len(n.peer_table)} peers online, "
                f"{n.directory.own_count()} local agents, {n.directory.remote_count()} remote "
                f"agents, mesh {n.settings.mesh!r}")

    async def status_loop(self) -> None:
        """STATUS= when it changes (checked every second) and WATCHDOG=1 at half of WatchdogSec."""
        n = self.node
        watchdog = n.notifier.watchdog_interval()
        tick = min(1.0, watchdog) if watchdog else 1.0
        last_status = ""
        last_ping = 0.0
        while True:
            line = self.status_line()
            if line != last_status:
                n.notifier.status(line)
                last_status = line
            now = time.monotonic()
            if watchdog and now - last_ping >= watchdog:
                # The loop turning is the health signal: a wedged routing loop stops the pings.
                n.notifier.watchdog()
                last_ping = now
            await asyncio.sleep(tick)
