"""``meshctl keys ...``: the node keypair, the authorized-keys folder and the mesh secret (files
only; no daemon needed, except ``keys trust NAME`` without a key, which asks the running daemon for
the key it saw in discovery).

Owns: those subcommands' behaviour and messages. Must not touch: key formats and file modes
(meshd/mesh/keys.py) or the config loading (meshd/config.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from meshd.cli.format import print_json, table
from meshd.config.settings import load_settings

__all__ = ["run_keys"]


def run_keys(args: argparse.Namespace) -> int:
    """meshctl keys ...: manage the node keypair and the authorized-keys folder (files only)."""
    from meshd.mesh import keys as K

    overrides: dict[str, Any] = {}
    if args.state_dir:
        overrides["state_dir"] = args.state_dir
    if args.authorized_keys_dir:
        overrides["authorized_keys_dir"] = args.authorized_keys_dir
    env = dict(os.environ)
    config = args.config or (Path(env["MESHD_CONFIG"]) if env.get("MESHD_CONFIG") else None)
    settings = load_settings(config, overrides=overrides, environ=env)
    authorized = settings.resolved_authorized_keys()
    if args.keys_cmd in ("show", "export"):
        pair = K.load_or_create_node_keys(settings.state_dir)
        if args.keys_cmd == "show":
            print(f"public key (z85): {pair.public}")
            print(f"public key (hex): {K.key_to_hex(pair.public)}")
            print(f"key file:         {K.node_key_paths(settings.state_dir)[0]}")
            print(f"as a static peer: tcp://HOST:PORT?key={K.key_to_hex(pair.public)}")
        else:
            text = K.node_key_paths(settings.state_dir)[0].read_text()
            if args.output:
                Path(args.output).write_text(text)
            else:
                sys.stdout.write(text)
    elif args.keys_cmd == "trust":
        key = args.key
        if key is None:
            from meshd.cli.field import discovered_key

            key = discovered_key(args.socket, args.name)
            if key is None:
                return 1
        if Path(key).is_file():
            found = K.read_public_key(Path(key))
            if found is None:
                print(f"meshctl: no public key in {key}", file=sys.stderr)
                return 1
            key = found
        path = K.trust_key(authorized, args.name, key)
        print(f"trusted {args.name}: {path} (a running daemon picks it up within a second)")
    elif args.keys_cmd == "untrust":
        removed = K.untrust_key(authorized, args.name)
        if not removed:
            print(f"meshctl: no trusted key named {args.name!r} in {authorized}", file=sys.stderr)
            return 1
        for path in removed:
            print(f"removed {path}")
    elif args.keys_cmd == "list":
        store = K.TrustStore("keys", authorized)
        rows = [{"name": name, "key": key} for key, name in sorted(store.keys.items(), key=lambda kv: kv[1])]
        if args.json:
            print_json(rows)
        else:
            table(rows, ["name", "key"])
    elif args.keys_cmd == "secret":
        target = Path(args.path)
        if target.exists():
            print(f"meshctl: {target} exists; not overwriting a mesh secret", file=sys.stderr)
            return 1
        try:
            K.create_mesh_secret(target, owner=args.owner)
        except PermissionError as exc:
            print(f"meshctl: cannot write {target}: {exc.strerror}" + (
                " (--owner needs root)" if args.owner else ""), file=sys.stderr)
            return 1
        owner = f", owner {args.owner}" if args.owner else ""
        print(f"wrote a new mesh secret to {target} (mode 0600{owner}); copy it to every node of the fleet")
    return 0
