"""Running the daemon once its settings are known, and the re-exec'd image's own entry point.

Owns: the daemon's logging set-up, ``--regenerate-id``, the insecure-mode warning, serving the
node until SIGTERM/SIGINT, and the exit codes of a failed start (2: config, keys, state files,
permissions, which a restart cannot fix; 1: anything else). ``meshd run`` reaches it through
meshd/cli.py; the image ``meshd run`` re-execs (``python -m meshd ... --settings-fd N``,
meshd/daemon/reexec.py) through :func:`image_main`, which parses no command line (no argparse: what the
validating image parsed travels with the settings).
Must not import argparse, pydantic or meshd.config (the daemon's image stays small: ~10 MiB less when idle).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from meshd.client.tracing import current_ids
from meshd.errors import ConfigError, StateFileError
from meshd.mesh.keys import KeyFileError

if TYPE_CHECKING:
    from meshd.config.settings import Settings

__all__ = ["image_main", "run_daemon", "setup_logging"]

log = logging.getLogger("meshd")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        ids = current_ids()  # written inside a span: a log shipper links the line to its trace
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        return json.dumps(entry)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("zeroconf").setLevel(max(logging.WARNING, root.level))


async def _serve(settings: Settings) -> int:
    from meshd.daemon.node import Node

    node = Node(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await node.serve(stop)
    return 0


def _user_name() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def image_main(argv: list[str]) -> int:
    """``python -m meshd <args> --settings-fd N``: read the settings and run options the validating
    image left in fd N (meshd/daemon/reexec.py) and run the daemon; exit 2 when they cannot be read."""
    from meshd.daemon.reexec import FD_FLAG, read_image

    try:
        at = argv.index(FD_FLAG) + 1
        if at >= len(argv) or not argv[at].isdigit():
            raise ValueError(f"{FD_FLAG} needs a file descriptor number")
        settings, options = read_image(int(argv[at]))
    except ValueError as exc:
        print(f"meshd: {exc}", file=sys.stderr)
        return 2
    return run_daemon(settings, regenerate_id=bool(options.get("regenerate_id", False)))


def run_daemon(settings: Any, *, regenerate_id: bool = False) -> int:
    """Serve the node with ``settings`` (Settings or its snapshot) until SIGTERM/SIGINT; the exit code."""
    setup_logging(settings.log_level, settings.log_format)
    if regenerate_id:
        from meshd.mesh.keys import reset_identity

        removed = reset_identity(settings.state_dir)
        log.warning("--regenerate-id: removed %s; a new node id and keypair are made now",
                    ", ".join(map(str, removed)) or "nothing (no identity yet)")
    if settings.insecure:
        log.warning("INSECURE MODE: the mesh runs in plaintext; anyone on the LAN can read and inject")
    stop_export: Callable[[], None] | None = None
    try:
        if getattr(settings, "otlp_endpoint", None):
            from meshd.daemon.otlp import start_export

            stop_export = start_export(settings.otlp_endpoint, str(settings.name))
            log.info("exporting the daemon's spans over OTLP/HTTP to %s", settings.otlp_endpoint)
        return asyncio.run(_serve(settings))
    except KeyboardInterrupt:
        return 0
    except ConfigError as exc:
        print(f"meshd: config error: {exc}", file=sys.stderr)
        return 2
    except KeyFileError as exc:
        print(f"meshd: cannot start: {exc}", file=sys.stderr)
        return 2
    except StateFileError as exc:
        # Corrupt state: restarting cannot fix it (exit 2, which the systemd unit does not restart).
        print(f"meshd: cannot start: {exc}", file=sys.stderr)
        return 2
    except PermissionError as exc:
        # A file or directory this user may not read or write: retrying cannot fix it (exit 2, which
        # the systemd unit does not restart).
        print(f"meshd: cannot start: {exc.filename}: {exc.strerror} (fix: give the user meshd runs as, "
              f"{_user_name()}, access to it)", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, zmq.ZMQError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    finally:
        if stop_export is not None:
            stop_export()  # the spans still batched go out before the process ends
