"""Dead letters count what they really cost in memory: a malformed message of
10,000 tiny frames costs far more than its bytes, so a byte cap over payload bytes alone let
1,100 such letters grow the daemon by 570 MB while the cap counted 20 MB."""

from __future__ import annotations

import gc
import tracemalloc

from meshd.delivery.dead_letters import DeadLetters


def test_many_tiny_frames_stay_within_the_byte_cap_in_real_memory() -> None:
    cap = 8 * 1024 * 1024
    letters = DeadLetters(capacity=100_000, max_bytes=cap)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(300):  # 300 letters of 10,000 frames of 2 bytes: 6 MB of "bytes"
            frames = [b"%02d" % (j % 100) for j in range(10_000)]
            letters.add("malformed:too_many_frames", f"letter {i}", frames, {"kind": "send"})
            del frames
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    print(f"dead letters: kept {len(letters.list())}, counted {letters.counted_bytes} bytes, "
          f"real growth {grown} bytes, cap {cap}")
    assert letters.counted_bytes <= cap
    assert grown <= cap * 1.25, f"{grown} bytes held for a {cap}-byte cap"
    assert letters.evicted > 0  # the cap, not the count, evicted


def test_counted_bytes_return_to_zero() -> None:
    letters = DeadLetters(capacity=10, max_bytes=1024 * 1024)
    for i in range(20):
        letters.add("r", "d", [b"x" * 100, b"y"], {"kind": "send", "id": str(i)})
    assert len(letters.list()) == 10 and letters.counted_bytes > 10 * 101
    seq = letters.list()[0]["seq"]
    assert letters.pop(seq) is not None
    letters.purge()
    assert letters.counted_bytes == 0
