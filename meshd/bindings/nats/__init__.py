"""``meshd bridge``: joins this site's mesh to other sites' meshes through NATS (docs/sites.md).

A process of its own, attached to the local daemon as agents, so the daemon's image never loads
the NATS client. ``subjects`` (pure) maps names and topics to subject tokens; ``envelope`` (pure)
is what crosses; ``directory`` keeps the other sites' agents; ``bridge`` moves messages;
``run`` is the command.
"""
