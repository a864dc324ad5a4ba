"""The daemon: the composition root and what runs it.

Holds :class:`~meshd.daemon.node.Node` (builds every part in dependency order and owns the
start/stop steps), the embedded node (a ``Node`` inside an agent's process, ``embedded``), the
periodic loops (``timers``), meshctl's queries (``admin``), the start of ``meshd run`` after its
re-exec (``run``, ``reexec``), systemd notification (``sdnotify``), the address watcher
(``address_watch``) and the doctor's report (``doctor``).

May import everything below it (daemon parts, services, config, wire); never ``cli``.
Nothing below imports it: parts receive what they call when they are built.
"""
