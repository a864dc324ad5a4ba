"""The daemon's asyncio without ``ssl`` until something asks for it: ~4.5 MiB less per daemon.

asyncio imports ``ssl`` at import time, and with it OpenSSL (``_ssl``, libssl, libcrypto: ~4.5
MiB resident), although the daemon does not speak TLS unless asked to (CurveZMQ on the mesh, a
plain-HTTP gateway on loopback by default). :func:`activate` imports asyncio
while ``ssl`` cannot be found, so asyncio notes ``ssl = None`` as on a Python built without it,
and leaves a finder in ``sys.meta_path`` for the first later ``import ssl`` (aiohttp, an https
client in a plugin, the gateway's TLS context): that import loads the real module, then hands it
to the asyncio modules that noted ``None``. asyncio's one TLS entry that needs no ``ssl`` object
from its caller, ``ssl=True`` (``SSLProtocol``), imports it first. So TLS through asyncio works as
if ``ssl`` had been there from the start (tests/unit/test_lazy_ssl.py).

Only the daemon's own image activates it (``meshd/__init__.py``, when started as the image
``meshd run`` re-execs, meshd/daemon/reexec.py): an agent's process is the user's, and meshd does not
change how the user's asyncio imports. ``MESHD_LAZY_SSL=0`` turns it off; it does nothing when
asyncio or ssl is already imported.
Owns: the two finders and the hand-over to asyncio's modules (:func:`hand_ssl_to_asyncio`).
Must not touch any other import, nor import anything of meshd.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # nothing more at run time: this module is imported by every agent too
    from collections.abc import Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType

__all__ = ["ENV_SWITCH", "activate", "hand_ssl_to_asyncio", "held_back"]

ENV_SWITCH = "MESHD_LAZY_SSL"  # "0": import asyncio as usual (ssl and OpenSSL at once)

#: Modules imported while ssl was held back (asyncio's): the ones to hand ssl to later.
held_back: list[str] = []


class _RefuseSsl:
    """In ``sys.meta_path`` only while asyncio is imported: ``import ssl`` fails as if missing."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname == "ssl":
            raise ModuleNotFoundError("ssl is imported on first use (meshd/util/lazyssl.py)", name=fullname)
        return None


class _SslThenAsyncio:
    """The real ``ssl`` loader; once it has run, asyncio gets the module (:func:`hand_ssl_to_asyncio`)
    and the finder that wrapped it leaves ``sys.meta_path``."""

    def __init__(self, real: Any, finder: object) -> None:
        self.real = real
        self.finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.real.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self.real.exec_module(module)
        hand_ssl_to_asyncio(module)
        _remove(self.finder)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... as the real loader
        return getattr(self.real, name)


class _OnFirstSslImport:
    """Finds nothing itself: for ``import ssl`` it finds the real spec with the other finders and
    wraps its loader in :class:`_SslThenAsyncio`. It stays until ssl has been executed, so a mere
    ``importlib.util.find_spec("ssl")`` (a library checking for TLS support) does not use it up."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != "ssl":
            return None
        spec = None
        for finder in list(sys.meta_path):  # as the import system looks, minus this finder
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = cast("ModuleSpec | None", find(fullname, path, target)) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return None  # no ssl in this Python: asyncio says so itself when TLS is asked for
        spec.loader = cast("Loader", _SslThenAsyncio(spec.loader, self))
        return spec


def _remove(finder: object) -> None:
    try:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
    except ValueError:
        pass


def hand_ssl_to_asyncio(ssl: ModuleType) -> None:
    """Give ``ssl`` to the modules imported while it was held back (they noted ``ssl = None``) and
    define what asyncio.sslproto defines only when ssl is there."""
    for name in held_back:
        module = sys.modules.get(name)
        if module is not None and "ssl" in vars(module) and vars(module)["ssl"] is None:
            setattr(module, "ssl", ssl)  # noqa: B010  (a module global, not a declared attribute)
    sslproto = sys.modules.get("asyncio.sslproto")
    if sslproto is not None and not hasattr(sslproto, "SSLAgainErrors"):
        setattr(sslproto, "SSLAgainErrors", (ssl.SSLWantReadError, ssl.SSLSyscallError))  # noqa: B010


def _import_ssl_first(init: Any) -> Any:
    """``SSLProtocol.__init__`` that imports ssl first (handing it to asyncio), for ``ssl=True``
    callers that never imported it themselves."""
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        import ssl  # noqa: F401  (the finder above hands it to asyncio's modules)
        init(self, *args, **kwargs)
    return __init__


def activate() -> bool:
    """Import asyncio with ssl held back (see the module docstring); True when it did."""
    if "asyncio" in sys.modules or "ssl" in sys.modules or os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    before = set(sys.modules)
    refuse = _RefuseSsl()
    sys.meta_path.insert(0, refuse)
    try:
        import asyncio.sslproto
    finally:
        _remove(refuse)
    held_back.extend(sorted(set(sys.modules) - before))
    if "ssl" in sys.modules:
        return False
    protocol = asyncio.sslproto.SSLProtocol
    protocol.__init__ = _import_ssl_first(protocol.__init__)  # type: ignore[method-assign]
    sys.meta_path.insert(0, _OnFirstSslImport())
    return True
