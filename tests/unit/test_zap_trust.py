"""The ZAP gate and trust policy alone (no sockets): an allow/deny matrix, like pyzmq's test_auth."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq
from zmq.utils import z85

from meshd.config.settings import Settings
from meshd.errors import ConfigError
from meshd.mesh.keys import TrustStore, derive_mesh_keypair, trust_key, untrust_key
from meshd.mesh.security import ZAP_DOMAIN, Security, ZapPolicy


def _keypair() -> tuple[str, bytes]:
    public, _secret = zmq.curve_keypair()
    return public.decode(), z85.decode(public)


def _request(raw_key: bytes, *, domain: str = ZAP_DOMAIN, mechanism: bytes = b"CURVE",
             version: bytes = b"1.0") -> list[bytes]:
    return [b"rid", b"", version, b"req-7", domain.encode(), b"10.0.0.9", b"", mechanism, raw_key]


@pytest.fixture()
def keys_trust(tmp_path: Path) -> tuple[TrustStore, Path]:
    return TrustStore("keys", tmp_path / "authorized_keys"), tmp_path / "authorized_keys"


def test_trusted_key_is_accepted_with_its_key_as_user_id(keys_trust: tuple[TrustStore, Path]) -> None:
    trust, folder = keys_trust
    public, raw = _keypair()
    trust_key(folder, "peer1", public)
    assert trust.reload()
    reply = ZapPolicy(trust).answer(_request(raw))
    assert reply == [b"rid", b"", b"1.0", b"req-7", b"200", b"OK", public.encode(), b""]


@pytest.mark.parametrize("case", ["untrusted", "domain", "plain", "short-key", "version"])
def test_refusals(keys_trust: tuple[TrustStore, Path], case: str) -> None:
    trust, folder = keys_trust
    public, raw = _keypair()
    if case != "untrusted":
        trust_key(folder, "peer1", public)
        trust.reload()
    request = {
        "untrusted": _request(raw),
        "domain": _request(raw, domain="other"),
        "plain": _request(raw, mechanism=b"PLAIN"),
        "short-key": _request(raw[:31]),
        "version": _request(raw, version=b"2.0"),
    }[case]
    policy = ZapPolicy(trust)
    reply = policy.answer(request)
    assert reply is not None and reply[4] == b"400" and reply[6] == b""


def test_untrusting_a_key_refuses_it_again(keys_trust: tuple[TrustStore, Path]) -> None:
    trust, folder = keys_trust
    public, raw = _keypair()
    trust_key(folder, "peer1", public)
    trust.reload()
    policy = ZapPolicy(trust)
    assert policy.answer(_request(raw))[4] == b"200"  # type: ignore[index]
    untrust_key(folder, "peer1")
    assert trust.reload()
    assert policy.answer(_request(raw))[4] == b"400"  # type: ignore[index]
    assert policy.stats["auth_accepted"] == 1 and policy.stats["auth_refused"] == 1


def test_garbage_requests_never_raise(keys_trust: tuple[TrustStore, Path]) -> None:
    policy = ZapPolicy(keys_trust[0])
    assert policy.answer([b"x"]) is None  # too short to answer at all
    reply = policy.answer([b"rid", b"", b"1.0", b"req", b"meshd"])  # short: refused with 500
    assert reply is not None and reply[4] == b"500"
    assert policy.stats["zap_errors"] == 2


def test_secret_mode_trusts_only_the_mesh_key_and_pins_it() -> None:
    pair = derive_mesh_keypair(b"s" * 32)
    security = Security(Settings())
    security.trust = TrustStore("secret", None, mesh_public=pair.public)
    other, raw_other = _keypair()
    assert ZapPolicy(security.trust).answer(_request(z85.decode(pair.public)))[4] == b"200"  # type: ignore[index]
    assert ZapPolicy(security.trust).answer(_request(raw_other))[4] == b"400"  # type: ignore[index]
    assert security.server_key(None) == pair.public  # pin the mesh key
    assert security.server_key(other) is None  # a node of another secret: not dialed
    assert security.static_server_key(None) == pair.public


def test_keys_mode_policy_pins_trusted_keys_and_detects_spoofing(keys_trust: tuple[TrustStore, Path]) -> None:
    trust, folder = keys_trust
    good, _ = _keypair()
    bad, _ = _keypair()
    trust_key(folder, "good", good)
    trust.reload()
    security = Security(Settings())
    security.trust = trust
    assert security.server_key(good) == good and security.server_key(bad) is None
    assert security.server_key(5) is None
    assert security.admit(good, None) is None  # trusted, not greeted yet
    assert security.admit(good, good) is None
    assert security.admit(bad, None) == "dropped_untrusted"
    assert security.admit(good, "some-other-key") == "dropped_spoofed"


def test_plaintext_on_a_lan_interface_is_refused(tmp_path: Path) -> None:
    security = Security(Settings(insecure=True, state_dir=tmp_path))
    ctx = zmq.Context()
    try:
        with pytest.raises(ConfigError):
            security.start(ctx, None, ["192.168.1.5"])  # type: ignore[arg-type]  # refused before use
        security.start(ctx, None, ["127.0.0.1"])  # type: ignore[arg-type]  # loopback: allowed
        assert security.curve is None and security.trust is None
    finally:
        ctx.term()
