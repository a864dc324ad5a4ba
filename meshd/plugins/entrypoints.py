"""The ``meshd`` entry points: listed once at start, each loaded by its ``module:attr`` value.

Owns: listing the entry-point group (name, value, "distribution version"), loading one value the
way ``importlib.metadata.EntryPoint.load`` does, and the list ``meshd run``'s validating image
hands over with the settings (meshd/daemon/reexec.py), so the daemon's own image does not import
importlib.metadata (with email, zipfile and csv about 1.5 MiB) only to read that list again.
Must not touch: registering or calling plugins (meshd/plugins.py does, blocked ones included).
"""

from __future__ import annotations

import functools
import importlib
import re
from typing import Final

__all__ = ["Listed", "hand_over", "handed_over", "list_entry_points", "load_value"]

#: (entry-point name, its value "module:attr", "distribution version" or None)
Listed = tuple[str, str, str | None]

_VALUE: Final = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")
_handed_over: list[Listed] | None = None


def list_entry_points(group: str) -> list[Listed]:
    """The installed entry points of ``group`` (reads every distribution's metadata)."""
    import importlib.metadata

    out: list[Listed] = []
    for ep in importlib.metadata.entry_points(group=group):
        try:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else None
        except Exception:
            dist = None
        out.append((ep.name, ep.value, dist))
    return out


def hand_over(listed: list[Listed]) -> None:
    """Use ``listed`` instead of reading the metadata again (the re-exec'd daemon, once)."""
    global _handed_over
    _handed_over = list(listed)


def handed_over() -> list[Listed] | None:
    """The list the validating image handed over, or None (then list them here)."""
    return _handed_over


def load_value(value: str) -> object:
    """Import ``module`` and walk ``attr`` of an entry-point value ``module:attr [extras]``."""
    match = _VALUE.match(value)
    if match is None:
        raise ValueError(f"not an entry-point value: {value!r}")
    module = importlib.import_module(match.group("module"))
    attrs = filter(None, (match.group("attr") or "").split("."))
    return functools.reduce(getattr, attrs, module)
