"""CurveZMQ keys and trust: the node keypair, the mesh-secret keypair, the authorized-keys folder.

Two trust modes (../shared/DESIGN.md, Security):
- ``keys``: every node has its own keypair in ``<state_dir>/keys/``; a folder of trusted public
  keys (one file per node) is the allow-list. Identity is per node.
- ``secret``: a secret file shared by a fleet; every node derives the same mesh keypair from it.
  Knowing the secret is membership.

Key files use ZeroMQ's certificate format (ZPL), so ``zmq.auth.load_certificate`` and other
ZeroMQ tooling read them. Secret files are created 0600 and refused when others can read them.
"""

from __future__ import annotations

import base64
import importlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from meshd.errors import MeshError

log = logging.getLogger("meshd.keys")

MIN_SECRET_BYTES = 16
_Z85_KEY = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_KEY_LINE = re.compile(r'public-key\s*=\s*"([^"]{40})"')
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class KeyFileError(MeshError):
    """A key file is missing, malformed or unsafe; the message says which and what to do."""

    code = "KEY_ERROR"


@dataclass(frozen=True)
class KeyPair:
    public: str  # z85, 40 characters
    secret: str  # z85, 40 characters


def is_z85_key(text: str) -> bool:
    return bool(_Z85_KEY.match(text))


def key_to_hex(key: str) -> str:
    return bytes(z85.decode(key.encode())).hex()


def fingerprint(key: str) -> str:
    """``SHA256:<base64>`` of a z85 public key's 32 bytes, as SSH prints host keys (compare by eye)."""
    try:
        raw = z85.decode(key.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raw = key.encode("utf-8", "replace")
    return "SHA256:" + base64.b64encode(_sha256(raw)).decode("ascii").rstrip("=")


def _sha256(data: bytes) -> bytes:
    """SHA-256 by CPython's built-in module (hashlib's own fallback), so that a daemon which
    fingerprints the keys of nodes it discovers does not map OpenSSL's libcrypto (~3.5 MiB,
    meshd/util/lazyssl.py); hashlib where that module is missing."""
    for name in ("_sha2", "_sha256"):  # Python 3.12+, 3.11
        try:
            return bytes(importlib.import_module(name).sha256(data).digest())
        except ImportError:
            continue
    import hashlib

    return hashlib.sha256(data).digest()


def key_from_hex(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) != 32:
        raise ValueError("a CURVE key is 32 bytes (64 hex digits)")
    return str(z85.encode(raw).decode())


def _this_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def unreadable(path: Path, exc: OSError) -> KeyFileError:
    """The typed error for a key file this process may not read or write (exit 2: a retry cannot fix it)."""
    user = _this_user()
    return KeyFileError(
        f"{path}: {exc.strerror or exc} (fix: chown {user}: {path} && chmod 600 {path}; it must belong "
        f"to the user meshd runs as, {user}; `meshctl keys secret --owner {user}` creates it so)"
    )


def check_private(path: Path) -> None:
    """Refuse a secret file that anyone but its owner can read or write."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except PermissionError as exc:
        raise unreadable(path, exc) from None
    if mode & 0o077:
        raise KeyFileError(
            f"{path} has mode {mode:04o}: a secret must be readable by its owner only "
            f"(run: chmod 600 {path})"
        )


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _cert_text(public: str, secret: str | None, comment: str) -> str:
    lines = [f"#   {comment}", "#   ZeroMQ CURVE certificate written by meshd", "metadata", "curve",
             f'    public-key = "{public}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret}"')
    return "\n".join(lines) + "\n"


NODE_KEY_FIX = ("fix: restore it from a backup, or remove node.key and node.key_secret and start "
                "again: the node gets a new key, which its peers must trust anew")


def node_key_paths(state_dir: Path) -> tuple[Path, Path]:
    keys = state_dir / "keys"
    return keys / "node.key", keys / "node.key_secret"


def reset_identity(state_dir: Path) -> list[Path]:
    """Delete this node's id and keypair (``node_id``, the key files) so the next start makes new
    ones: the fix for a cloned state dir. Returns the files removed."""
    removed = []
    for path in (state_dir / "node_id", *node_key_paths(state_dir)):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            continue
    return removed


def load_or_create_node_keys(state_dir: Path) -> KeyPair:
    """The node's own keypair: created on first start, refused if the secret file is unsafe."""
    public_path, secret_path = node_key_paths(state_dir)
    if secret_path.exists():
        check_private(secret_path)
        try:
            public_b, secret_b = zmq.auth.load_certificate(secret_path)
        except PermissionError as exc:
            raise unreadable(secret_path, exc) from None
        except (OSError, ValueError) as exc:
            raise KeyFileError(f"{secret_path}: cannot read the node key: {exc} ({NODE_KEY_FIX})") from None
        if not secret_b:
            raise KeyFileError(f"{secret_path}: no secret-key in the file ({NODE_KEY_FIX})")
        if len(public_b) != 40 or len(secret_b) != 40:
            raise KeyFileError(f"{secret_path}: the keys in it are not 40-character z85 CURVE keys "
                               f"({NODE_KEY_FIX})")
        return KeyPair(public_b.decode(), secret_b.decode())
    public_b, secret_b = zmq.curve_keypair()
    public, secret = public_b.decode(), secret_b.decode()
    try:
        _write_private(secret_path, _cert_text(public, secret, "meshd node secret key: keep private"))
        public_path.write_text(_cert_text(public, None, "meshd node public key"))
    except PermissionError as exc:
        raise unreadable(Path(exc.filename or secret_path), exc) from None
    log.info("created node keypair in %s", secret_path.parent)
    return KeyPair(public, secret)


def load_mesh_secret(path: Path) -> bytes:
    try:
        check_private(path)
        data = path.read_bytes().strip()
    except FileNotFoundError:
        raise KeyFileError(f"mesh secret file {path} does not exist") from None
    except PermissionError as exc:
        raise unreadable(path, exc) from None
    if len(data) < MIN_SECRET_BYTES:
        raise KeyFileError(f"mesh secret in {path} is too short: use at least {MIN_SECRET_BYTES} bytes")
    return data


def derive_mesh_keypair(secret: bytes) -> KeyPair:
    """Every node with the same secret derives the same CURVE keypair."""
    import hashlib  # here, not at start: it maps OpenSSL's libcrypto (meshd/util/lazyssl.py)

    seed = hashlib.blake2b(secret, digest_size=32, person=b"meshd-mesh-key1").digest()
    secret_z85 = z85.encode(seed)
    public_z85 = zmq.curve_public(secret_z85)
    return KeyPair(public_z85.decode(), secret_z85.decode())


def create_mesh_secret(path: Path, owner: str | None = None) -> None:
    """A new random secret in ``path``, mode 0600, owned by ``owner`` (a user name; default: whoever runs
    this). Root gives it to the daemon's user with ``owner="meshd"``: meshd must read it, nobody else."""
    uid = gid = -1
    if owner is not None:
        import pwd

        try:
            entry = pwd.getpwnam(owner)
        except KeyError:
            raise KeyFileError(f"no such user {owner!r} to own {path}") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    secret = os.urandom(32).hex() + "\n"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            if owner is not None:
                os.fchown(f.fileno(), uid, gid)  # before a byte is written: never readable by root only
            f.write(secret)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def read_public_key(path: Path) -> str | None:
    """A trusted-key file: a ZeroMQ certificate, or a bare z85 or hex key on one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    match = _KEY_LINE.search(text)
    if match and is_z85_key(match.group(1)):
        return match.group(1)
    for line in text.splitlines():
        line = line.strip()
        if is_z85_key(line):
            return line
        if re.fullmatch(r"[0-9a-fA-F]{64}", line):
            return key_from_hex(line)
    return None


class TrustStore:
    """Which CURVE public keys may talk to this node; re-read from disk without a restart."""

    def __init__(self, mode: str, authorized_dir: Path | None, mesh_public: str | None = None) -> None:
        self.mode = mode
        self.authorized_dir = authorized_dir
        self.mesh_public = mesh_public
        self.keys: dict[str, str] = {}  # key -> file name (node label)
        self._stamp: tuple[tuple[str, float], ...] | None = None
        self.reload()

    def is_trusted(self, key: str) -> bool:
        if self.mode == "secret":
            return key == self.mesh_public
        return key in self.keys

    def _scan(self) -> tuple[tuple[str, float], ...]:
        if self.authorized_dir is None or not self.authorized_dir.is_dir():
            return ()
        entries = []
        for path in sorted(self.authorized_dir.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                entries.append((path.name, path.stat().st_mtime))
        return tuple(entries)

    def reload(self) -> bool:
        """Re-read the authorized-keys folder if it changed; True when the trusted set changed."""
        if self.mode == "secret":
            return False
        stamp = self._scan()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        keys: dict[str, str] = {}
        assert self.authorized_dir is not None or not stamp
        for name, _ in stamp:
            assert self.authorized_dir is not None
            key = read_public_key(self.authorized_dir / name)
            if key is None:
                log.warning("ignoring %s: no CURVE public key in it", self.authorized_dir / name)
                continue
            keys[key] = name
        changed = keys != self.keys
        self.keys = keys
        if changed:
            log.info("trusted keys: %d", len(keys))
        return changed


def trust_key(authorized_dir: Path, name: str, key: str) -> Path:
    """Add ``key`` (z85 or hex) under ``name`` to the authorized-keys folder."""
    if not _NAME.match(name):
        raise KeyFileError(f"invalid key name {name!r}: use letters, digits, '.', '_', '-'")
    if not is_z85_key(key):
        try:
            key = key_from_hex(key)
        except ValueError:
            raise KeyFileError("not a CURVE public key: expected 40 z85 characters or 64 hex digits") \
                from None
    authorized_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = authorized_dir / f"{name}.key"
    path.write_text(_cert_text(key, None, f"trusted meshd node {name}"))
    return path


def untrust_key(authorized_dir: Path, name_or_key: str) -> list[Path]:
    """Remove the file named ``name_or_key`` (or every file holding that key)."""
    removed: list[Path] = []
    if not authorized_dir.is_dir():
        return removed
    for path in authorized_dir.iterdir():
        if not path.is_file():
            continue
        if path.stem == name_or_key or path.name == name_or_key or read_public_key(path) == name_or_key:
            path.unlink()
            removed.append(path)
    return removed
