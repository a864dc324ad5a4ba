"""``meshd bridge``: its checks and its lifetime (SIGINT/SIGTERM stop it cleanly)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import Final

from meshd.bindings.nats.bridge import Bridge, BridgeOptions
from meshd.bindings.nats.subjects import Subjects, valid_site
from meshd.errors import ConfigError, MeshError

__all__ = ["NATS_EXTRA_HINT", "check_options", "run_bridge"]

log = logging.getLogger("meshd.bridge")

NATS_EXTRA_HINT: Final = "meshd bridge needs the 'nats' extra: pip install 'meshd-daemon[nats]'"


def check_options(opts: BridgeOptions) -> None:
    """Raises :class:`ConfigError` naming the flag (exit 2) before anything connects."""
    if not valid_site(opts.site):
        raise ConfigError("--site", f"{opts.site!r}: 1-63 of a-z 0-9 -, not starting with '-'")
    if not opts.servers:
        raise ConfigError("--nats", "give at least one NATS server URL")
    try:
        Subjects(opts.prefix)
    except MeshError as exc:
        raise ConfigError("--prefix", exc.message) from None
    if not opts.announce_interval > 0 or opts.hold < 2 * opts.announce_interval:
        raise ConfigError("--hold", "must be at least twice --announce-interval (which must be > 0)")


async def _main(opts: BridgeOptions) -> None:
    bridge = Bridge(opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await bridge.start()
        await stop.wait()
    finally:
        await bridge.close()


def run_bridge(opts: BridgeOptions) -> int:
    try:
        import nats  # noqa: F401
    except ImportError:
        print(NATS_EXTRA_HINT, file=sys.stderr)
        return 2
    try:
        check_options(opts)
    except ConfigError as exc:
        print(f"meshd bridge: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(_main(opts))
        except MeshError as exc:
            print(f"meshd bridge: {exc.message}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"meshd bridge: cannot reach NATS or the daemon: {exc}", file=sys.stderr)
            return 1
    return 0
