"""The commands: ``meshd`` (run, demo, mcp, doctor, ...) and ``meshctl`` (peers, agents, send, ...).

Holds the argument parsing and output of both commands (:mod:`meshd.cli.main`), meshctl's output
formats (``format``), ``meshctl top`` (``top``), ``meshctl keys`` (``keys``), the edge-fleet
commands (``field``) and the demos (``demo``, ``demo_plan``).

The top layer: it may import anything; nothing in meshd imports it.
"""

from meshd.cli.main import meshctl_main, meshd_main

__all__ = ["meshctl_main", "meshd_main"]
