"""Micro-benchmark: what a daemon pays to forward one 64-message batch, by frame layout.

    .venv/bin/python bench/frames.py

One process, inproc sockets, nothing else running: recv a batch from one socket and send it on
another, the daemon's per-batch work minus the routing logic. Compares the current layout
([SIG, batch-header, h1, p1, ... h64, p64] = 130 frames) with the whole body in one frame
([SIG, batch-header, body] = 3 frames), and pyzmq's recv_multipart/send_multipart (which do
per-frame Python work, including enum flag arithmetic) with a loop over the Cython base methods.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq
from zmq.backend import Socket as BaseSocket

N = 3000
NOBLOCK, SNDMORE, RCVMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.RCVMORE)


def pair(ctx: zmq.Context[Any], name: str) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
    a, b = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    for s in (a, b):
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
    b.bind(f"inproc://{name}")
    a.connect(f"inproc://{name}")
    return a, b


def fwd_sugar(src: zmq.Socket[Any], dst: zmq.Socket[Any], n: int) -> None:
    for _ in range(n):
        dst.send_multipart(src.recv_multipart(zmq.NOBLOCK), zmq.NOBLOCK)


def fwd_base(src: zmq.Socket[Any], dst: zmq.Socket[Any], n: int) -> None:
    recv, send, get = BaseSocket.recv, BaseSocket.send, BaseSocket.get
    for _ in range(n):
        parts = [recv(src, NOBLOCK)]
        while get(src, RCVMORE):
            parts.append(recv(src, NOBLOCK))
        last = len(parts) - 1
        for i, p in enumerate(parts):
            send(dst, p, (NOBLOCK | SNDMORE) if i < last else NOBLOCK)


def fwd_frames(src: zmq.Socket[Any], dst: zmq.Socket[Any], n: int) -> None:
    recv, send = BaseSocket.recv, BaseSocket.send
    for _ in range(n):
        parts = [recv(src, NOBLOCK, copy=False)]
        while parts[-1].more:
            parts.append(recv(src, NOBLOCK, copy=False))
        last = len(parts) - 1
        for i, p in enumerate(parts):
            send(dst, p, (NOBLOCK | SNDMORE) if i < last else NOBLOCK, copy=False)


def main() -> None:
    ctx = zmq.Context()
    payload = msgpack.packb({"id": "abc-123", "ts": time.time(), "seq": 1, "body": "x" * 252})
    header = msgpack.packb({"kind": "send", "id": "m1", "topic": "bench"})
    batch_header = msgpack.packb({"kind": "batch", "id": "b", "from": "s", "to": "r", "count": 64})
    sig = b"MSH\x01"
    layouts = {
        "130 frames (current)": [sig, batch_header] + [header, payload] * 64,
        "3 frames (one body)": [sig, batch_header, msgpack.packb([header, payload] * 64)],
    }
    loops = {"send/recv_multipart": fwd_sugar, "base methods, int flags": fwd_base,
             "base methods, copy=False": fwd_frames}
    print(f"{'layout':22s} {'forwarding loop':26s} {'us/batch':>9s} {'us/msg':>7s}")
    for label, msg in layouts.items():
        for name, fn in loops.items():
            a, b = pair(ctx, f"in-{label}-{name}")
            c, d = pair(ctx, f"out-{label}-{name}")
            for _ in range(N):
                a.send_multipart(msg)
            time.sleep(0.05)
            t = time.perf_counter()
            fn(b, c, N)
            dt = (time.perf_counter() - t) / N
            print(f"{label:22s} {name:26s} {dt * 1e6:9.1f} {dt / 64 * 1e6:7.2f}")
            for s in (a, b, c, d):
                s.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
