"""A LAN of test hosts on one Linux machine, built from network namespaces (root only).

Each host ``PREFIX<i>`` is a network namespace with one interface ``eth0`` at ``198.18.0.<i>/24``
(198.18.0.0/15 is reserved for benchmarking), plugged into one bridge that lives in its own
namespace ``PREFIXsw`` (the switch). Multicast, hence mDNS, works between the hosts; nothing
reaches the machine's real interfaces. Faults a test can inject:

* :meth:`Netlab.cut` / :meth:`Netlab.plug`: the switch port goes down (the host sees no carrier
  on the far side: a cable pulled);
* :meth:`Netlab.silence` / :meth:`Netlab.unsilence`: the switch drops the port's frames with the
  link up, as a managed switch does while a port is listening/learning (STP) after boot;
* :meth:`Netlab.loss`: the host drops a share of what it receives (nftables, random);
* :meth:`Netlab.block` / :meth:`Netlab.unblock`: the host drops everything on ``eth0``, in and out.

Used by tests/multihost through :class:`Netlab`; also a command for people::

    python -m meshd.testing.netlab up 3 mh      # hosts mh1..mh3
    python -m meshd.testing.netlab cut mh2
    python -m meshd.testing.netlab down mh

Needs root, iproute2 (``ip``) and, for loss, silence and block, nftables (``nft``).
:func:`skip_reason` says which is missing. Prefixes must hold no digit (hosts are named by a
trailing number). Standard library only.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import string
import subprocess
import sys
from collections.abc import Sequence

__all__ = ["Netlab", "NetlabError", "random_prefix", "skip_reason"]

SUBNET = "198.18.0"


class NetlabError(RuntimeError):
    """A command that builds or changes the lab failed (its output is in the message)."""


def skip_reason(need_nft: bool = False) -> str | None:
    """Why multi-host tests cannot run here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "multi-host tests need Linux network namespaces"
    if os.geteuid() != 0:
        return "multi-host tests need root (they create network namespaces)"
    if shutil.which("ip") is None:
        return "multi-host tests need iproute2 (`ip` not found)"
    if need_nft and shutil.which("nft") is None:
        return "this multi-host test needs nftables (`nft` not found)"
    return None


def random_prefix(start: str = "mt") -> str:
    """A prefix no other test run uses at the same time (letters only)."""
    # From the OS, not the `random` module's state, which tests may seed alike in every worker.
    return start + "".join(random.SystemRandom().choices(string.ascii_lowercase, k=4))


def _run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetlabError(f"{' '.join(args)} failed ({done.returncode}): "
                          f"{done.stderr.strip() or done.stdout.strip()}")
    return done


class Netlab:
    """The hosts ``prefix1..prefixN`` on one switch. ``up`` builds them, ``down`` removes them all."""

    def __init__(self, prefix: str) -> None:
        if not prefix or any(c.isdigit() for c in prefix) or len(prefix) > 9:
            raise ValueError(f"netlab prefix {prefix!r}: 1-9 characters, no digits")
        self.prefix = prefix
        self.switch = f"{prefix}sw"
        self.size = 0
        self.cut_hosts: set[int] = set()

    def host(self, i: int) -> str:
        return f"{self.prefix}{i}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i}"

    def _port(self, i: int) -> str:
        return f"v{self.host(i)}"  # the switch side of host i's cable (at most 15 characters)

    def up(self, n: int) -> None:
        """Build ``n`` hosts (1..250) on the switch. On failure, what was built is removed."""
        if not 1 <= n <= 250:
            raise ValueError(f"netlab hosts: 1..250, not {n}")
        try:
            _run(["ip", "netns", "add", self.switch])
            _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            # No STP and no learning delay: the switch forwards at once (silence() imitates a
            # switch that does not).
            _run(["ip", "-n", self.switch, "link", "set", "br0", "type", "bridge", "stp_state", "0",
                  "forward_delay", "0"], check=False)
            _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for i in range(1, n + 1):
                self.add_host(i)
        except BaseException:
            self.down()
            raise

    def add_host(self, i: int) -> None:
        """Plug host ``i`` into the switch (also after ``up``: a host that joins the LAN later)."""
        host, port = self.host(i), self._port(i)
        _run(["ip", "netns", "add", host])
        _run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host])
        _run(["ip", "link", "set", port, "netns", self.switch])
        _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
        _run(["ip", "-n", host, "addr", "add", f"{self.address(i)}/24", "dev", "eth0"])
        _run(["ip", "-n", host, "link", "set", "eth0", "up"])
        _run(["ip", "-n", host, "link", "set", "lo", "up"])
        self.size = max(self.size, i)

    def down(self) -> None:
        """Remove every host of this prefix and the switch (idempotent)."""
        listed = _run(["ip", "netns", "list"], check=False).stdout.split()
        for name in listed:
            rest = name[len(self.prefix):]
            if name.startswith(self.prefix) and rest.isdigit():
                _run(["ip", "netns", "del", name], check=False)
        if self.switch in listed:
            _run(["ip", "netns", "del", self.switch], check=False)
        self.cut_hosts.clear()

    def exec_args(self, i: int, *cmd: str) -> list[str]:
        """The command line running ``cmd`` on host ``i`` (``ip netns exec`` execs: same PID)."""
        return ["ip", "netns", "exec", self.host(i), *cmd]

    def cut(self, i: int) -> None:
        """Unplug host ``i`` (the switch port goes down)."""
        _run(["ip", "-n", self.switch, "link", "set", self._port(i), "down"])
        self.cut_hosts.add(i)

    def plug(self, i: int) -> None:
        _run(["ip", "-n", self.switch, "link", "set", self._port(i), "up"])
        self.cut_hosts.discard(i)

    def counters(self, i: int) -> tuple[int, int]:
        """(packets, bytes) in+out so far at host ``i``'s interface: what the LAN carried for it."""
        out = _run(["ip", "-n", self.host(i), "-s", "-j", "link", "show", "eth0"]).stdout
        stats = json.loads(out)[0]["stats64"]
        return (stats["rx"]["packets"] + stats["tx"]["packets"],
                stats["rx"]["bytes"] + stats["tx"]["bytes"])

    def _nft(self, netns: str, *script: str) -> None:
        _run(["ip", "netns", "exec", netns, "nft", *script])

    def loss(self, i: int, pct: int) -> None:
        """Host ``i`` drops ``pct`` % of the packets it receives on eth0 (0 clears)."""
        if not 0 <= pct <= 100:
            raise ValueError(f"loss: 0..100 %, not {pct}")
        host = self.host(i)
        _run(["ip", "netns", "exec", host, "nft", "delete", "table", "inet", "netlab_loss"], check=False)
        if pct:
            self._nft(host, "add", "table", "inet", "netlab_loss")
            self._nft(host, "add", "chain", "inet", "netlab_loss", "input",
                      "{ type filter hook input priority 0; }")
            self._nft(host, "add", "rule", "inet", "netlab_loss", "input", "iifname", "eth0",
                      "numgen", "random", "mod", "100", "<", str(pct), "drop")

    def block(self, i: int, only: str | None = None) -> None:
        """Host ``i`` drops everything on eth0, both ways (its own firewall, link up); with
        ``only="tcp"`` just TCP (mDNS still flows: it hears nodes it cannot reach)."""
        if only not in (None, "tcp", "udp"):
            raise ValueError(f"block only tcp or udp, not {only!r}")
        host = self.host(i)
        self.unblock(i)
        self._nft(host, "add", "table", "inet", "netlab_block")
        match = ["meta", "l4proto", only] if only else []
        for hook, key in (("input", "iifname"), ("output", "oifname")):
            self._nft(host, "add", "chain", "inet", "netlab_block", hook,
                      f"{{ type filter hook {hook} priority -10; }}")
            self._nft(host, "add", "rule", "inet", "netlab_block", hook, key, "eth0", *match, "drop")

    def unblock(self, i: int) -> None:
        _run(["ip", "netns", "exec", self.host(i), "nft", "delete", "table", "inet", "netlab_block"],
             check=False)

    def silence(self, i: int) -> None:
        """The switch drops every frame from and to host ``i``'s port, with the link up (a port
        still listening/learning, or a silent drop at a managed switch)."""
        port = self._port(i)
        table = f"silence_{i}"
        self.unsilence(i)
        self._nft(self.switch, "add", "table", "bridge", table)
        self._nft(self.switch, "add", "chain", "bridge", table, "forward",
                  "{ type filter hook forward priority -10; }")
        self._nft(self.switch, "add", "rule", "bridge", table, "forward", "iifname", port, "drop")
        self._nft(self.switch, "add", "rule", "bridge", table, "forward", "oifname", port, "drop")

    def unsilence(self, i: int) -> None:
        _run(["ip", "netns", "exec", self.switch, "nft", "delete", "table", "bridge", f"silence_{i}"],
             check=False)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m meshd.testing.netlab up N [PREFIX] | down [PREFIX] | cut|plug|silence|unsilence|
    block|unblock HOST | loss HOST PCT | exec HOST CMD...``"""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = __doc__.split("::", 1)[1].split("\n\n", 1)[0] if __doc__ else ""
    if not args:
        print(f"usage:{usage}", file=sys.stderr)
        return 2
    cmd, rest = args[0], args[1:]

    def split_host(name: str) -> tuple[Netlab, int]:
        prefix = name.rstrip(string.digits)
        if prefix == name:
            raise SystemExit(f"netlab: {name!r} is not a host name (PREFIX and a number)")
        return Netlab(prefix), int(name[len(prefix):])

    try:
        if cmd == "up":
            Netlab(rest[1] if len(rest) > 1 else "mh").up(int(rest[0]))
        elif cmd == "down":
            Netlab(rest[0] if rest else "mh").down()
        elif cmd in {"cut", "plug", "silence", "unsilence", "block", "unblock"}:
            lab, i = split_host(rest[0])
            getattr(lab, cmd)(i)
        elif cmd == "loss":
            lab, i = split_host(rest[0])
            lab.loss(i, int(rest[1]))
        elif cmd == "exec":
            lab, i = split_host(rest[0])
            os.execvp("ip", lab.exec_args(i, *rest[1:]))
        else:
            print(f"netlab: unknown command {cmd!r}; usage:{usage}", file=sys.stderr)
            return 2
    except (NetlabError, ValueError, IndexError) as exc:
        print(f"netlab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
