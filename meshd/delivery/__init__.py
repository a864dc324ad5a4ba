"""Delivery: where each message goes, on this node, and what happens when it cannot.

Holds the data path (:mod:`~meshd.delivery.router`: edge checks, route, deliver, bounce), the local
agent socket and agent control (``local_agents``), the requests delivered and not yet answered
(``open_requests``), publications and the hold for full subscribers (``publications``,
``publication_hold``), dead letters (``dead_letters``), collaboration outcomes for plugins
(``outcomes``), the hand-over of agents across a daemon restart (``handover``) and the driver of
the qos-1 machine (``qos1_driver``).

May import: ``mesh``, ``qos1``, ``plugins``, ``discovery``, ``config``, ``wire``, ``transport``,
``util``, ``errors``. Never ``client``, ``daemon``, ``cli`` or the services.
"""
