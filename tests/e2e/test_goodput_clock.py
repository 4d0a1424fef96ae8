"""The goodput account counts from the launcher's own start, not from whatever exec'd it.

A real shell sleeps first, writes the time just before its ``exec``, and execs the console
script (as a container entrypoint or ``scripts/demo.sh`` does). The kernel's creation time of the
launcher's process is the shell's, 3 s before the exec; the account must not hold those 3 s.
Its wall time is compared with the outside clock: at most the time from the shell's exec to the
process's end (it starts after the exec and ends before the exit), where the shell's start would
make it 3 s longer. No timed assertion on the product's speed: the bound is the job's own span.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from tests.forked_agents import cli_command
from tests.helpers import REPO_ROOT, agent_env

SCRIPT = Path(__file__).resolve().parent / "scripts" / "touch.py"
SLEEP_S = 3


def test_an_exec_after_a_sleep_is_not_counted(tmp_path: Path) -> None:
    stamp = tmp_path / "exec_at"
    log_dir = tmp_path / "logs"
    command = " ".join(
        [*cli_command(), "--standalone", "--nproc-per-node", "1", "--no-live"]
        + ["--log-dir", str(log_dir), str(SCRIPT)]
    )
    shell = f'sleep {SLEEP_S}; date +%s.%N > "{stamp}"; exec {command}'
    began = time.time()
    done = subprocess.run(
        ["sh", "-c", shell],
        env=agent_env({"MARKER": str(tmp_path / "ran")}),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ended = time.time()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()
    exec_at = float(stamp.read_text())
    assert exec_at - began >= SLEEP_S  # the shell did sleep before the exec
    (run_dir,) = log_dir.iterdir()
    last = json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])
    assert last["kind"] == "goodput", last
    wall_s = float(last["fields"]["wall_s"])
    # Counted from the shell's start it would be SLEEP_S longer than the exec-to-exit span.
    assert 0 < wall_s <= (ended - exec_at) + 0.25, (wall_s, ended - exec_at, done.stderr)
    summary = [line for line in done.stderr.splitlines() if "goodput" in line]
    assert summary and f"of {wall_s:.1f} s" in summary[-1], done.stderr
