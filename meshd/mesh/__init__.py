"""The mesh of daemons: peers, their liveness, the directory of agents, and who may join.

Holds the peer table (``peers``, dialing in ``peer_dial``), the online -> stale -> offline rule
(``liveness``) and both-ways proof (``two_way``), the directory of agents and its deltas
(``directory``, ``directory_updates``), CURVE keys and the trust gate (``keys``, ``security``),
cloned node ids (``clones``) and nodes discovered that are not peers (``sightings``).

May import: ``discovery``, ``config``, ``wire``, ``transport``, ``util``, ``errors``. Never
``client``, ``delivery``, ``daemon``, ``cli`` or the services.
"""
