"""Finding other daemons on the LAN: zeroconf (mDNS/DNS-SD) advertising and browsing.

Holds :class:`~meshd.discovery.mdns.Discovery` (the service record, the browser, interface
selection) and the doctor's passive mDNS counter (``mdns_watch``).

May import: ``util``, ``wire``, ``errors``. Never the mesh, delivery or anything above.
"""

from meshd.discovery.mdns import SERVICE_TYPE, Discovery, PeerAdvert, default_interfaces

__all__ = ["SERVICE_TYPE", "Discovery", "PeerAdvert", "default_interfaces"]
