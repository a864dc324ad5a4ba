"""meshd: a peer-mesh daemon for agents on a LAN.

The public API is small: ``Agent`` (asyncio) and ``BlockingAgent`` to attach to the local daemon,
``Message`` as handlers see it, and the typed errors. The daemon itself is ``meshd run``.
"""

from .client import DEFER, Agent, BlockingAgent, HandoffResult, Message
from .errors import (
    Cancelled,
    ConfigError,
    DaemonUnreachable,
    HandlerError,
    HopLimit,
    InboxFull,
    MeshError,
    NameTaken,
    NoSuchAgent,
    NotRegistered,
    OutboxFull,
    PeerUnreachable,
    RequestTimeout,
    StorageFull,
    TooLarge,
    Undeliverable,
    ValidationFailed,
)
from .hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = [
    "DEFER",
    "Agent",
    "BlockingAgent",
    "Cancelled",
    "ConfigError",
    "DaemonUnreachable",
    "HandlerError",
    "HandoffResult",
    "HopLimit",
    "InboxFull",
    "MeshError",
    "Message",
    "NameTaken",
    "NoSuchAgent",
    "NotRegistered",
    "OutboxFull",
    "PeerUnreachable",
    "RequestTimeout",
    "StorageFull",
    "TooLarge",
    "Undeliverable",
    "ValidationFailed",
    "__version__",
    "hookimpl",
]
