"""Where the machine forbids reading a worker's memory (a sandbox without ptrace, as the GPU
machines' gVisor may be), the hang verdict still fires, and the missing stacks are one clear line,
never a traceback.

Forbidden for real, by the kernel: the agent runs without CAP_SYS_PTRACE (``setpriv`` drops it
from the bounding set, so py-spy, its child, has none) and the worker makes itself non-dumpable
(``PR_SET_DUMPABLE`` 0), which only that capability overrides. py-spy's attach is refused.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.forked_agents import cli_command
from tests.helpers import agent_env

pytestmark = pytest.mark.timeout(180)

WORKER = """
import ctypes, time
from elastic_run.worker import progress
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: only CAP_SYS_PTRACE may read us
for step in range(5):
    progress(step)
    time.sleep(0.05)
while True:  # silent from here: hung
    time.sleep(0.05)
"""


def test_a_hang_is_judged_and_the_missing_stacks_are_one_line(tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "missing: setpriv (util-linux)"
    script = tmp_path / "hangs.py"
    script.write_text(WORKER)
    logs = tmp_path / "logs"
    done = subprocess.run(
        [setpriv, "--bounding-set", "-sys_ptrace", "--", *cli_command()]
        + ["--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--no-live"]
        + ["--no-warm-start", "--hang-timeout", "3", "--log-dir", str(logs), str(script)],
        env=agent_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    hung = [line for line in done.stderr.splitlines() if "worker.hung" in line]
    assert len(hung) == 1, done.stderr
    assert "no stacks:" in hung[0] and "ptrace" in hung[0], hung
    (stacks,) = logs.glob("*/attempt_0/0/stacks.txt")
    text = stacks.read_text()
    assert "no stacks:" in text and "ptrace" in text, text
