"""Importing the client (``from meshd import Agent``) must not load the daemon's dependencies:
an agent process stays small (its idle memory). ``hookimpl`` still resolves for plugin authors."""

from __future__ import annotations

import subprocess
import sys

DAEMON_SIDE = ("pydantic", "pydantic_core", "pluggy", "zeroconf", "sqlite3", "meshd.config",
               "meshd.daemon.node", "meshd.hookspecs")

PROBE = """
import sys
from meshd import Agent, BlockingAgent, Message
loaded = sorted(m for m in sys.modules if m in {names!r} or m.split('.')[0] in {roots!r})
print(','.join(loaded))
"""


def test_importing_the_client_loads_no_daemon_dependency() -> None:
    roots = tuple(n for n in DAEMON_SIDE if "." not in n)
    out = subprocess.run([sys.executable, "-c", PROBE.format(names=DAEMON_SIDE, roots=roots)],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"from meshd import Agent loaded {out}"


def test_hookimpl_still_resolves_on_first_use() -> None:
    import meshd
    from meshd.hookspecs import hookimpl

    assert meshd.hookimpl is hookimpl


def test_embedded_node_resolves_on_first_use_only() -> None:
    probe = ("import sys, meshd; before = 'meshd.daemon.embedded' in sys.modules; "
             "from meshd import EmbeddedNode; import meshd.daemon.embedded as m; "
             "print(before, EmbeddedNode is m.EmbeddedNode)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
