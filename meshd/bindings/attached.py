"""Running a binding process that attaches to the local daemon as an agent (``meshd mcp``,
``meshd a2a``): its log lines, and its exit codes, the same for every such command.

Exit 2 for what a restart cannot fix (a bad option or config), 1 for a mesh error (the daemon
refused or went away), 0 for a clean stop (SIGTERM, Ctrl-C).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from meshd.errors import ConfigError, MeshError


def run_attached(command: str, logger: str, serve: Coroutine[Any, Any, Any]) -> int:
    """Run ``serve`` to its end under ``command``'s name (``"meshd mcp"``) and map how it ended to
    an exit code; ``logger``'s INFO lines are shown, everyone else's from WARNING."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"{command}: %(message)s")
    logging.getLogger(logger).setLevel(logging.INFO)
    try:
        asyncio.run(serve)
    except ConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    except MeshError as exc:
        print(f"{command}: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
