"""The daemon's image imports asyncio without ssl (meshd/util/lazyssl.py); TLS through asyncio still works
once something imports ssl later or asks for ``ssl=True``, the daemon's modules import neither ssl
nor OpenSSL, and an agent's process (``import meshd`` anywhere else) gets asyncio as usual."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

OPENSSL_MODULES = ("ssl", "_ssl", "_hashlib", "hashlib", "hmac", "secrets")


def run(code: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


IMAGE = "import sys; sys.argv[1:] = ['--settings-fd', '0']; "  # as `python -m meshd` re-exec'd sees it


def loaded(modules: str) -> str:
    return f"import sys, {modules}; print(sorted(m for m in {OPENSSL_MODULES!r} if m in sys.modules))"


def test_the_daemon_image_leaves_ssl_out() -> None:
    assert run(IMAGE + loaded("meshd")) == "[]"


def test_an_agent_process_gets_asyncio_as_usual() -> None:
    probe = "import sys, meshd; print('ssl' in sys.modules, any('lazyssl' in repr(f) for f in sys.meta_path))"
    assert run(probe) == "True False"


def test_the_daemon_modules_load_no_openssl() -> None:
    # What `meshd run`'s image imports at start (its cli, node, gateway, tools, tasks, spawning).
    modules = ("meshd, meshd.cli, meshd.daemon.reexec, meshd.daemon.node, meshd.gateway.service, "
               "meshd.tools.service, "
               "meshd.tasks.service, meshd.tools.spawn, meshd.mesh.keys, meshd.gateway.sessions")
    assert run(IMAGE + loaded(modules)) == "[]"


def test_switched_off_or_asyncio_first_is_left_alone() -> None:
    probe = "import sys, meshd; print('ssl' in sys.modules, any('lazyssl' in repr(f) for f in sys.meta_path))"
    assert run(IMAGE + probe, MESHD_LAZY_SSL="0") == "True False"
    assert run(IMAGE + "import asyncio; " + probe) == "True False"


def test_ssl_looked_up_before_it_is_imported_still_reaches_asyncio() -> None:
    probe = (IMAGE + "import importlib.util, meshd; importlib.util.find_spec('ssl'); import ssl; "
             "import asyncio.base_events as b, asyncio.sslproto as p; "
             "print(b.ssl is ssl, p.SSLAgainErrors == (ssl.SSLWantReadError, ssl.SSLSyscallError), "
             "any('lazyssl' in repr(f) for f in sys.meta_path))")
    assert run(probe).split() == ["True", "True", "False"]


def test_a_key_fingerprint_is_sha256_without_openssl() -> None:
    probe = (IMAGE + "import base64, meshd.mesh.keys as k; from zmq.utils import z85; "
             "raw = bytes(range(32)); "
             "f = k.fingerprint(z85.encode(raw).decode()); print('_hashlib' in sys.modules); "
             "import hashlib; want = base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip('='); "
             "print(f == 'SHA256:' + want)")
    assert run(probe).split() == ["False", "True"]


TLS_ECHO = """
import sys
sys.argv[3:] = ['--settings-fd', '0']
import meshd, asyncio
assert 'ssl' not in sys.modules
import ssl  # a plugin's or an agent's https client, the gateway's TLS context
server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
server_ctx.load_cert_chain(sys.argv[1], sys.argv[2])
client_ctx = ssl.create_default_context(cafile=sys.argv[1])

async def main():
    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(echo, '127.0.0.1', 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection('127.0.0.1', port, ssl=client_ctx)
    writer.write(b'over tls\\n')
    line = await reader.readline()
    cipher = writer.get_extra_info('cipher')
    writer.close()
    server.close()
    await server.wait_closed()
    print(line.decode().strip(), cipher is not None)

asyncio.run(main())
"""


def make_cert(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_tls_through_asyncio_works_when_ssl_is_imported_later(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    out = subprocess.run([sys.executable, "-c", TLS_ECHO, str(cert), str(key)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["over", "tls", "True"]


TLS_SERVER = """
import socket, ssl, sys
ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
with socket.create_server(('127.0.0.1', 0)) as s:
    print(s.getsockname()[1], flush=True)
    conn, _ = s.accept()
    with ctx.wrap_socket(conn, server_side=True) as t:
        t.sendall(t.recv(100))
"""

SSL_TRUE_CLIENT = IMAGE + """
import os, meshd, asyncio
assert 'ssl' not in sys.modules

async def main():  # ssl=True: asyncio makes the context itself; nothing imported ssl before
    reader, writer = await asyncio.open_connection('127.0.0.1', int(os.environ['PORT']), ssl=True)
    writer.write(b'ssl=True\\n')
    print((await reader.readline()).decode().strip())
    writer.close()

asyncio.run(main())
"""


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_ssl_true_through_asyncio_works_without_importing_ssl(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    server = subprocess.Popen([sys.executable, "-c", TLS_SERVER, str(cert), str(key)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        # SSL_CERT_FILE: the default context trusts the test certificate.
        assert run(SSL_TRUE_CLIENT, PORT=port, SSL_CERT_FILE=str(cert)) == "ssl=True"
        assert server.wait(30) == 0
    finally:
        server.kill()
        server.wait(5)
