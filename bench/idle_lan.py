"""What an idle mesh costs per peer, on a real LAN of network namespaces (root; meshd.testing.netlab).

``python bench/idle_lan.py --hosts 4 --seconds 20`` builds N hosts on one switch, starts one
``meshd run`` per host with the default liveness settings (plaintext LAN mode, as the field runs
it on a private bridge), waits until every daemon lists every other online, then counts for
``--seconds`` of idleness: packets and bytes in+out at each host's interface, and each daemon's CPU
(utime+stime from /proc). It prints per host and per peer (divided by N-1) and removes everything
it built. Nothing reaches the machine's real interfaces.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from meshd.testing import MeshdProcess, short_tempdir, wait_until
from meshd.testing.netlab import Netlab, random_prefix, skip_reason


class _NetnsMeshd(MeshdProcess):
    """``meshd run`` inside host ``netns`` (``ip netns exec`` execs: the Popen pid is the daemon's)."""

    def __init__(self, netns: str, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.netns = netns

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *super().command()]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--form-timeout", type=float, default=90.0)
    parser.add_argument("--py-spy", metavar="FILE", default=None,
                        help="also sample h1's daemon with py-spy during the idle window (collapsed "
                             "stacks to FILE; needs py-spy on PATH)")
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    n = max(2, min(args.hosts, 32))
    lab = Netlab(random_prefix("ic"))
    work = short_tempdir("mshidle-")
    mesh = f"idle{uuid.uuid4().hex[:10]}"
    daemons: list[_NetnsMeshd] = []
    try:
        lab.up(n)
        config = work / "meshd.toml"
        config.write_text("allow_insecure_lan = true\n")
        for i in range(1, n + 1):
            d = _NetnsMeshd(lab.host(i), f"h{i}", mesh, work,
                            ["--config", str(config), "--interface", lab.address(i)])
            daemons.append(d)
            d.start(wait=False)
        for d in daemons:
            d.wait_ready()
        t0 = time.monotonic()
        for d in daemons:
            wait_until(lambda d=d: sum(p["state"] == "online" for p in d.query("peers")) >= n - 1,
                       args.form_timeout, interval=0.2, what=f"{d.name} to see {n - 1} peers online")
        formed = time.monotonic() - t0
        time.sleep(2.0)  # let start-up traffic (directories, mDNS announcements) settle
        before = [(lab.counters(i), _cpu_seconds(d.pid)) for i, d in enumerate(daemons, 1)]
        start = time.monotonic()
        spy = None
        if args.py_spy:
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(daemons[0].pid), "--format", "raw",
                                    "--duration", str(int(args.seconds)), "--rate", "250", "--output",
                                    args.py_spy, "--nonblocking"], stdout=subprocess.DEVNULL)
        time.sleep(args.seconds)
        if spy is not None:
            spy.wait(30)
        took = time.monotonic() - start
        after = [(lab.counters(i), _cpu_seconds(d.pid)) for i, d in enumerate(daemons, 1)]
        flapped = [d.name for d in daemons
                   if sum(p["state"] == "online" for p in d.query("peers")) < n - 1]
        pkts = [(a[0][0] - b[0][0]) / took for a, b in zip(after, before, strict=True)]
        byts = [(a[0][1] - b[0][1]) / took for a, b in zip(after, before, strict=True)]
        cpu = [100 * (a[1] - b[1]) / took for a, b in zip(after, before, strict=True)]
        med = sorted(range(n), key=lambda i: pkts[i])[n // 2]
        print(f"idle LAN mesh: {n} daemons, formed in {formed:.1f} s, measured {took:.1f} s idle"
              + (f", NOT ONLINE at the end: {flapped}" if flapped else ", no flap"))
        print("| host | packets/s in+out | per peer | bytes/s | per peer | daemon CPU % |")
        print("|---|---|---|---|---|---|")
        for i in range(n):
            print(f"| h{i + 1} | {pkts[i]:.1f} | {pkts[i] / (n - 1):.1f} | {byts[i]:.0f} | "
                  f"{byts[i] / (n - 1):.0f} | {cpu[i]:.2f} |")
        print(f"median host: {pkts[med] / (n - 1):.1f} packets/s and {byts[med] / (n - 1):.0f} bytes/s "
              f"per peer, CPU {sorted(cpu)[n // 2]:.2f} %")
        return 1 if flapped else 0
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.proc.send_signal(signal.SIGTERM)
        for d in daemons:
            if d.proc is not None:
                try:
                    d.proc.wait(10)
                except subprocess.TimeoutExpired:
                    d.proc.kill()
        lab.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
