"""meshctl and meshd as a person or a script uses them: real daemons, real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from meshd.testing import MeshdFactory, MeshdProcess, wait_until

CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]


def ctl(proc: MeshdProcess, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CTL, "--socket", str(proc.socket), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_meshctl_commands_across_two_daemons(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    echo = subprocess.Popen([*CTL, "--socket", str(b.socket), "agent", "echo", "--echo"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail_out = tmp_path / "tail.jsonl"
    with open(tail_out, "w") as out:
        tail = subprocess.Popen([*CTL, "--socket", str(b.socket), "tail", "news"], stdout=out,
                                stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: {"echo"} <= {x["name"] for x in a.query("agents")}, what="echo listed")
        wait_until(lambda: any("news" in (x.get("topics") or []) for x in a.query("agents")),
                   what="the tail subscribed")

        peers = ctl(a, "peers", "--json")
        assert peers.returncode == 0 and b.node_id in {p["node"] for p in json.loads(peers.stdout)}
        agents = ctl(a, "agents", "--json")
        assert agents.returncode == 0 and "echo" in {x["name"] for x in json.loads(agents.stdout)}
        table = ctl(a, "agents")
        assert table.returncode == 0 and "echo" in table.stdout and "NAME" in table.stdout

        r = ctl(a, "request", "echo", "ping", '{"n": 1}', "--timeout", "5")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"n": 1}

        missing = ctl(a, "request", "nobody", "ping", "{}", "--timeout", "5")
        assert missing.returncode == 1
        assert missing.stderr.strip().count("\n") == 0 and "NO_SUCH_AGENT" in missing.stderr

        assert ctl(a, "send", "echo", "note", '{"hello": "there"}').returncode == 0
        pub = ctl(a, "publish", "news", '{"headline": "x"}')
        assert pub.returncode == 0 and "reached 1 subscriber" in pub.stdout
        wait_until(lambda: "headline" in tail_out.read_text(), what="the tail printed the publication")
        line = json.loads(tail_out.read_text().splitlines()[0])
        assert line["topic"] == "news" and line["payload"] == {"headline": "x"} and line["kind"] == "publish"

        bad_json = ctl(a, "send", "echo", "note", "{not json")
        assert bad_json.returncode == 2 and "not valid JSON" in bad_json.stderr
    finally:
        for p in (echo, tail):
            p.send_signal(signal.SIGINT)
        for p in (echo, tail):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    assert echo.returncode == 0
    echoed = [json.loads(x) for x in (echo.stdout.read() if echo.stdout else "").splitlines() if x.strip()]
    assert any(e["kind"] == "send" and e["topic"] == "note" and e["payload"] == {"hello": "there"}
               for e in echoed), echoed


def test_meshctl_handoff_verdicts(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    code = (
        "import asyncio, sys\n"
        "from meshd import Agent\n"
        "async def main():\n"
        f"    async with Agent('worker', socket={str(a.socket)!r}) as me:\n"
        "        me.on('handoff-task')(lambda m: {'accepted': m.payload['task_id'] != 'no',"
        " 'reason': 'busy'})\n"
        "        await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_until(lambda: "worker" in {x["name"] for x in a.query("agents")}, what="worker")
        ok = ctl(a, "handoff", "worker", "t-1", "--context", '{"step": 1}', "--timeout", "5")
        assert ok.returncode == 0 and json.loads(ok.stdout)["accepted"] is True
        no = ctl(a, "handoff", "worker", "no", "--timeout", "5")
        assert no.returncode == 3 and json.loads(no.stdout) == {"accepted": False, "reason": "busy",
                                                               "data": None}
    finally:
        worker.kill()
        worker.wait(5)


def test_bad_config_names_the_key_and_exits_2(tmp_path: Path) -> None:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshd", "run", "--interface", "127.0.0.1",
                               "--insecure", "--state-dir", str(tmp_path / "st"), *args],
                              capture_output=True, text=True, timeout=30, env=env)

    conf = tmp_path / "meshd.toml"
    conf.write_text('heartbeat_interval = "often"\n')
    r = run("--config", str(conf))
    assert r.returncode == 2 and "heartbeat_interval" in r.stderr
    conf.write_text("prot = 7000\n")
    r = run("--config", str(conf))
    assert r.returncode == 2 and "prot" in r.stderr
    r = run(env={**os.environ, "MESHD_PORT": "70000"})
    assert r.returncode == 2 and "port" in r.stderr and "MESHD_PORT" in r.stderr
    r = run("--port", "-1")
    assert r.returncode == 2 and "port" in r.stderr
    # under systemd, ConfigurationDirectory= is where the file is found without --config
    confdir = tmp_path / "etc-meshd"
    confdir.mkdir()
    (confdir / "meshd.toml").write_text("hop_limit = 0\n")
    r = run(env={**os.environ, "CONFIGURATION_DIRECTORY": str(confdir)})
    assert r.returncode == 2 and "hop_limit" in r.stderr


def test_default_socket_found_by_daemon_and_meshctl_alike(tmp_path: Path) -> None:
    from meshd.testing import short_tempdir

    runtime = short_tempdir("mshrt-")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("RUNTIME_DIRECTORY", None)
    env.pop("MESHD_SOCKET", None)
    cmd = [sys.executable, "-m", "meshd", "run", "--interface", "127.0.0.1", "--insecure", "--no-discovery",
           "--mesh", f"rt{os.getpid()}", "--state-dir", str(tmp_path / "st")]
    daemon = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sock = runtime / "meshd" / "meshd.sock"
        wait_until(sock.exists, what="the socket in $XDG_RUNTIME_DIR/meshd")
        r = subprocess.run([*CTL, "node"], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["socket"] == str(sock)
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(15) == 0
        import shutil
        shutil.rmtree(runtime, ignore_errors=True)


def test_meshctl_top_shows_remote_agents_state_and_telemetry(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    code = (
        "import asyncio\n"
        "from meshd import Agent\n"
        "async def main():\n"
        f"    async with Agent('thinker', socket={str(b.socket)!r}, capabilities=['plan'],"
        " heartbeat_interval=0.2) as me:\n"
        "        me.set_telemetry(context_used_pct=42.0, tasks_summary='2 open')\n"
        "        await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    thinker = subprocess.Popen([sys.executable, "-c", code])
    try:
        def seen_at_a() -> dict[str, object] | None:
            rec = next((x for x in a.query("agents") if x["name"] == "thinker"), None)
            tele = (rec or {}).get("telemetry") or {}
            return rec if isinstance(tele, dict) and tele.get("context_used_pct") == 42.0 else None
        rec = wait_until(seen_at_a, what="thinker's telemetry at the other node")
        assert rec["state"] == "online"
        top = ctl(a, "top", "--once")
        assert top.returncode == 0, top.stderr
        line = next(x for x in top.stdout.splitlines() if x.startswith("thinker"))
        assert all(part in f" {line} " for part in (" b ", "online", "42", "2 open", "plan")), line
        assert "peers online" in top.stdout
    finally:
        thinker.kill()
        thinker.wait(5)
