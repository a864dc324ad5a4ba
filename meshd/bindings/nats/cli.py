"""``meshd bridge``'s flags (never imports the NATS client: ``meshd --help`` stays light)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run_from_args"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bridge", help="join this site's mesh to other sites' through NATS (needs the "
                       "'nats' extra; docs/sites.md)")
    p.add_argument("--site", required=True, help="this site's name (a-z 0-9 -): agents here are "
                   "NAME:SITE at the other sites")
    p.add_argument("--nats", dest="servers", action="append", default=[], metavar="URL",
                   help="NATS server URL, e.g. tls://hub.example:4222 or a local leaf node (repeatable)")
    p.add_argument("--socket", type=Path, default=None, help="the daemon's agent socket")
    p.add_argument("--name", default=None, help="the bridge's agent name (default: bridge-SITE)")
    p.add_argument("--prefix", default="meshd", help="subject prefix shared by the joined sites")
    p.add_argument("--creds", type=Path, default=None, help="NATS credentials file (.creds)")
    p.add_argument("--tls-ca", type=Path, default=None, help="CA certificate that signed the NATS server's")
    p.add_argument("--js-domain", default=None, metavar="DOMAIN",
                   help="the JetStream domain of the hub (a bridge on a leaf node without JetStream)")
    p.add_argument("--announce-interval", type=float, default=1.0, metavar="SECONDS")
    p.add_argument("--hold", type=float, default=10.0, metavar="SECONDS",
                   help="forget a site whose announcements stopped this long ago")
    p.add_argument("--max-remote-agents", type=int, default=256)
    p.add_argument("--max-in-flight", type=int, default=256,
                   help="requests from other sites served at once (past it: INBOX_FULL)")
    p.add_argument("--no-jetstream", action="store_true",
                   help="no qos 1 across sites (qos-1 sends cross as qos 0)")
    p.add_argument("--ack-wait", type=float, default=30.0, metavar="SECONDS",
                   help="JetStream redelivers a qos-1 send this bridge took and did not ack within this")
    p.add_argument("--max-deliver", type=int, default=10,
                   help="JetStream deliveries of one qos-1 send to this site before it gives up")


def run_from_args(args: argparse.Namespace) -> int:
    from meshd.bindings.nats.bridge import BridgeOptions
    from meshd.bindings.nats.run import run_bridge

    return run_bridge(BridgeOptions(
        site=args.site, servers=list(args.servers), socket=args.socket, name=args.name, prefix=args.prefix,
        creds=args.creds, tls_ca=args.tls_ca, js_domain=args.js_domain,
        announce_interval=args.announce_interval, hold=args.hold,
        max_remote_agents=max(0, args.max_remote_agents), max_in_flight=max(1, args.max_in_flight),
        jetstream=not args.no_jetstream, ack_wait=max(1.0, args.ack_wait),
        max_deliver=max(1, args.max_deliver)))
