"""``meshd demo --plan`` end to end: three real daemons, a plan whose tasks go to agents on the other
two, picked by capability and by the load they report; exit 0 and a clean stop."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_plan_runs_across_three_daemons() -> None:
    r = subprocess.run([sys.executable, "-m", "meshd", "demo", "--plan"], capture_output=True, text=True,
                       timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "plan done" in out
    table = dict(re.findall(r"^  (r1|r2|r3|w|v)\s+\S+\s+(\S+@node-\d)\s+1\s", out, re.MULTILINE))
    # research: least loaded first (queue 0 beats 1); on a tie of load, the lower context %; the
    # third research task goes to the other agent because of the two dispatches in flight
    assert table == {"r1": "researcher-a@node-2", "r2": "researcher-a@node-2", "r3": "researcher-b@node-3",
                     "w": "writer@node-3", "v": "verifier@node-2"}
    assert 'done by verifier: {"verified": true, "checked": "summary of 3 findings"}' in out
    assert "node-1 exited 0; node-2 exited 0; node-3 exited 0" in out
