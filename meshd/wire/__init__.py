"""The wire layer: frames, header, kinds, limits, error codes, payload codec, reserved names.

Pure: no sockets, no asyncio, no daemon state. :mod:`meshd.wire.protocol` is the frame layout and
the typed :class:`~meshd.wire.protocol.Header` (decoded and range-checked once, at the edge);
``payloads`` the client's msgpack codec; ``system_names`` the names daemons reserve (the system
agent, its topics). docs/PROTOCOL.md is the normative text.

May import: :mod:`meshd.errors`, :mod:`meshd.util`. Nothing else of meshd.
"""
