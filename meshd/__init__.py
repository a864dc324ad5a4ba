"""meshd: a peer-mesh daemon for agents on a LAN.

The public API is small: ``Agent`` (asyncio) and ``BlockingAgent`` to attach to the local daemon,
``Message`` as handlers see it, and the typed errors. The daemon itself is ``meshd run``.

Importing this package loads the client only: ``hookimpl`` (for plugin authors) and
``EmbeddedNode`` (a node inside the agent's process, docs/embedded.md) are resolved on first use,
so an agent process never imports the daemon's dependencies (pluggy, pydantic,
zeroconf, sqlite3). Must not import daemon modules at import time. In the daemon's own image
(``python -m meshd ... --settings-fd N``, what ``meshd run`` re-execs) it first imports asyncio
without ``ssl`` until something asks for TLS (meshd/util/lazyssl.py); an agent's asyncio is left alone.
"""

import sys
from typing import TYPE_CHECKING, Any

if "--settings-fd" in sys.argv[1:]:  # the daemon's image (meshd/daemon/reexec.py FD_FLAG), before asyncio
    from meshd.util import lazyssl

    lazyssl.activate()
from meshd.client import DEFER, Agent, BlockingAgent, GatherReply, GatherSummary, HandoffResult, Message
from meshd.errors import (
    Cancelled,
    ConfigError,
    DaemonStopping,
    DaemonUnreachable,
    HandlerError,
    HopLimit,
    InboxFull,
    MeshError,
    Nack,
    NameTaken,
    NoSuchAgent,
    NotRegistered,
    OutboxFull,
    PeerUnreachable,
    RequestTimeout,
    SchemaVersionUnsupported,
    StorageFull,
    TooLarge,
    Undeliverable,
    ValidationFailed,
)

if TYPE_CHECKING:
    from meshd.daemon.embedded import EmbeddedNode
    from meshd.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = [
    "DEFER",
    "Agent",
    "BlockingAgent",
    "Cancelled",
    "ConfigError",
    "DaemonStopping",
    "DaemonUnreachable",
    "EmbeddedNode",
    "GatherReply",
    "GatherSummary",
    "HandlerError",
    "HandoffResult",
    "HopLimit",
    "InboxFull",
    "MeshError",
    "Message",
    "Nack",
    "NameTaken",
    "NoSuchAgent",
    "NotRegistered",
    "OutboxFull",
    "PeerUnreachable",
    "RequestTimeout",
    "SchemaVersionUnsupported",
    "StorageFull",
    "TooLarge",
    "Undeliverable",
    "ValidationFailed",
    "__version__",
    "hookimpl",
]


def __getattr__(name: str) -> Any:
    if name == "hookimpl":  # pluggy (and pydantic, through hookspecs) only for plugin authors
        from meshd.hookspecs import hookimpl

        return hookimpl
    if name == "EmbeddedNode":  # the daemon in this process (docs/embedded.md): its imports only if used
        from meshd.daemon.embedded import EmbeddedNode

        return EmbeddedNode
    raise AttributeError(f"module 'meshd' has no attribute {name!r}")
