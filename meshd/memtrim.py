"""Give back the memory start-up used and no longer needs (issue 11, goal 6: an idle daemon's RSS).

Owns: one call, once the daemon is ready: a full garbage collection, then glibc's
``malloc_trim(0)``, which returns the free pages of the C heap (start-up parses the config,
imports a few hundred modules and builds pydantic validators; much of what that allocated is
freed by then but stays resident) to the kernel. Where libc is not glibc (musl, macOS), or
ctypes cannot load it, this is a no-op. The daemon already imports ctypes (ifaddr lists the
interfaces with it), so this costs no import.

Must not touch: anything but the allocator; never called on the routing path.
"""

from __future__ import annotations

import ctypes
import gc
import logging

__all__ = ["release_startup_memory"]

log = logging.getLogger("meshd.memtrim")


def _malloc_trim() -> bool:
    """glibc ``malloc_trim(0)``; False where there is no glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: libc is among them
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))


def release_startup_memory() -> None:
    """Collect garbage, then hand the C heap's free pages back to the kernel (glibc only)."""
    gc.collect()
    trimmed = _malloc_trim()
    log.debug("start-up memory released (malloc_trim: %s)", "yes" if trimmed else "not available")
