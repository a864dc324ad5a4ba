"""One shutdown flag for a whole node, handed to each part at construction.

The node sets it once when its shutdown begins; every part that must stop taking work then
(the peer table, the qos-1 driver, agent control, the router) reads it. No part's attribute is
written from outside the part.
"""

from __future__ import annotations

__all__ = ["Shutdown"]


class Shutdown:
    """Whether the node's shutdown has begun (it never un-begins)."""

    __slots__ = ("begun",)

    def __init__(self) -> None:
        self.begun = False

    def begin(self) -> None:
        self.begun = True
