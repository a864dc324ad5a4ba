"""meshd: a peer-mesh daemon for agents on a LAN.

The public API is small: ``Agent`` (asyncio) and ``BlockingAgent`` to attach to the local daemon,
``Message`` as handlers see it, and the typed errors. The daemon itself is ``meshd run``.
"""

from .client import Agent, BlockingAgent, Message
from .errors import (
    ConfigError,
    DaemonUnreachable,
    HandlerError,
    HopLimit,
    InboxFull,
    MeshError,
    NameTaken,
    NoSuchAgent,
    NotRegistered,
    PeerUnreachable,
    RequestTimeout,
    TooLarge,
    ValidationFailed,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "BlockingAgent",
    "ConfigError",
    "DaemonUnreachable",
    "HandlerError",
    "HopLimit",
    "InboxFull",
    "MeshError",
    "Message",
    "NameTaken",
    "NoSuchAgent",
    "NotRegistered",
    "PeerUnreachable",
    "RequestTimeout",
    "TooLarge",
    "ValidationFailed",
    "__version__",
]
