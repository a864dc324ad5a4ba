"""Agent Card signatures (A2A 1.0 ``AgentCard.signatures``: JWS over the card's RFC 8785 form).

Owns the key files and the two uses: signing the cards this server serves (``a2a.signing_key``,
its algorithm from the key's type) and verifying a remote card against the keys an operator
trusts (``a2a.card_keys``): a card one of them signed is trusted from any host. The JWS work is
the SDK's (``a2a.utils.signing``, on PyJWT); this module only loads keys and picks algorithms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final, cast

from a2a.types import AgentCard
from a2a.utils.signing import ProtectedHeader, create_agent_card_signer, create_signature_verifier

from meshd.errors import ConfigError

__all__ = ["ALGORITHMS", "card_signer", "card_verifier"]

#: Asymmetric algorithms only: a shared-secret HS256 "signature" would let any holder forge cards.
ALGORITHMS: Final = ["ES256", "ES384", "RS256", "PS256", "EdDSA"]


def _read(path: Path, key: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data:
        raise ConfigError(key, f"{path} is not a PEM key")
    return data


def _algorithm(pem: bytes, path: Path) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError("a2a.signing_key", f"{path}: not an unencrypted PEM private key ({exc})") from None
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return "ES256"
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP384R1):
        return "ES384"
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    raise ConfigError("a2a.signing_key", f"{path}: use an EC P-256/P-384, RSA or Ed25519 key")


def card_signer(path: Path, kid: str) -> Callable[[AgentCard], AgentCard]:
    """Signs a card in place (appends its signature) and returns it."""
    pem = _read(path, "a2a.signing_key")
    header = cast(ProtectedHeader, {"kid": kid, "alg": _algorithm(pem, path), "typ": "JOSE"})
    sign = create_agent_card_signer(pem, header)

    def signed(card: AgentCard) -> AgentCard:
        del card.signatures[:]
        return sign(card)

    return signed


def card_verifier(paths: list[Path]) -> Callable[[AgentCard], bool] | None:
    """Whether a card carries a valid signature by one of the keys in ``paths`` (None: no keys)."""
    if not paths:
        return None
    def provider(key: bytes) -> Callable[[str | None, str | None], bytes]:
        return lambda kid, jku: key  # one trusted key each: the kid is not needed to find it

    checks = [create_signature_verifier(provider(_read(p, "a2a.card_keys")), ALGORITHMS) for p in paths]

    def verified(card: AgentCard) -> bool:
        for check in checks:
            try:
                check(card)
                return True
            except Exception:  # the SDK's SignatureVerificationError family, or a bad key type
                continue
        return False

    return verified
