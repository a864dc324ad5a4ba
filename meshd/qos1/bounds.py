"""The qos-1 outbox's bounds: how much it may hold per destination and in total, and what a unit
counts against them.

Owns: :class:`OutboxBounds` (from the ``qos1_outbox_*`` settings) and :func:`unit_size` (frames
plus a measured per-unit overhead, so the byte bounds count memory). It must not touch the
store, sockets or routing: ``meshd/qos1.py`` applies the bounds (``Qos1.refusal``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UNIT_OVERHEAD", "OutboxBounds", "unit_size"]


UNIT_OVERHEAD = 1024
"""Bytes a unit costs in the outbox beyond its frames (entry, decoded header, index slots), so
the byte bounds count memory, not just payload (measured with tracemalloc: about 1,050 bytes
beyond the frames of a small send)."""


def unit_size(frames: list[bytes]) -> int:
    """What a unit counts against the outbox byte bounds."""
    return UNIT_OVERHEAD + sum(len(f) for f in frames)


@dataclass(frozen=True, slots=True)
class OutboxBounds:
    """How much the outbox holds, per destination and in total (the ``qos1_outbox_*`` settings)."""

    total_units: int = 20_000
    total_bytes: int = 128 * 1024 * 1024
    per_dest_units: int = 5_000
    per_dest_bytes: int = 32 * 1024 * 1024
