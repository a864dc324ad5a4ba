"""One back-off rule for every retry in meshd: exponential, capped, with full jitter.

Used for redials, qos-1 retries and deferrals. Jitter matters on a LAN: after a switch reboots,
every node would otherwise redial every peer in lock-step (AWS Architecture Blog, "Exponential
Backoff And Jitter": full jitter spreads retries best for the least total work).
"""

from __future__ import annotations

import random

__all__ = ["backoff_delay"]


def backoff_delay(attempt: int, base: float, cap: float, *, jitter: float = 0.5,
                  rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    The un-jittered delay is ``min(cap, base * 2 ** (attempt - 1))``; ``jitter`` (0..1) is the
    fraction of it that is random: 0 gives the plain exponential, 1 gives AWS's full jitter
    (uniform in ``[0, delay]``). The default keeps at least half the delay, so a retry never comes
    back much sooner than the documented schedule.
    """
    if attempt < 1:
        attempt = 1
    delay = min(cap, base * 2.0 ** min(attempt - 1, 62))
    if jitter <= 0:
        return delay
    jitter = min(jitter, 1.0)
    r = (rng or random).random()
    return delay * (1.0 - jitter) + delay * jitter * r
