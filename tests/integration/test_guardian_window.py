"""The guardian and the window between a worker's start and its registration.

A worker runs its own code at once; an agent SIGKILLed before it registered the worker's session
with the guardian must still leave nothing alive: not the worker (its parent-death signal), not
the grandchildren it started, in its session or in one of their own. The guardian finds them by
the token in their environment (``ELASTIC_RUN_GUARDIAN``), and a function worker by the session
that it registered itself. Real guardian, real processes, real SIGKILL; the agent is frozen in
the window (its ``register`` blocks, as an agent thread descheduled there would), so the moment
is not a matter of luck.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_run.agent.workers.guardian import GUARDIAN_ENV, Guardian
from tests.helpers import REPO_ROOT, is_alive, no_process_left, wait_until

pytestmark = pytest.mark.timeout(240)

START_S = 120.0  # interpreters (and a zygote importing torch) on a loaded 2-core machine
TARGETS = Path(__file__).with_name("guardian_targets.py")


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _pids(path: Path) -> list[int]:
    wait_until(path.exists, START_S, message=f"{path} never written")
    return [int(p) for p in path.read_text().split()]


def test_an_unregistered_token_carrier_and_its_grandchildren_die_with_the_guardian(
    tmp_path: Path, leftovers: list[int]
) -> None:
    guardian = Guardian()
    other = Guardian()  # another agent's token: not ours to kill
    guardian.start()
    try:
        mine = guardian.worker_env(os.environ)
        assert mine[GUARDIAN_ENV] == guardian.token and guardian.token != other.token
        worker = subprocess.Popen(
            [sys.executable, str(TARGETS), str(tmp_path)],
            env=mine,
            start_new_session=True,
        )
        bystanders = [
            subprocess.Popen(
                [sys.executable, "-c", "import signal; signal.pause()"],
                env=env,
                start_new_session=True,
            )
            for env in (other.worker_env(os.environ), dict(os.environ))
        ]
        leftovers += [worker.pid, *(b.pid for b in bystanders)]
        pids = _pids(tmp_path / "grandchildren.pids")
        leftovers += pids
        assert pids[0] == worker.pid and all(is_alive(p) for p in pids)

        guardian.close()  # EOF on its pipe: what the agent's death looks like; nothing registered

        assert worker.wait(START_S) == -signal.SIGKILL
        wait_until(lambda: no_process_left(pids), START_S, message="grandchildren left alive")
        assert all(b.poll() is None for b in bystanders)
    finally:
        guardian.close()
        for proc in [worker, *bystanders]:
            proc.kill()
            proc.wait()


FROZEN_AGENT = """
    import os, signal, sys, threading
    from pathlib import Path
    from elastic_run.agent.config import Std
    from elastic_run.agent.workers.function_workers import FunctionWorkers
    from elastic_run.agent.workers.guardian import Guardian
    from elastic_run.agent.workers.processes import WorkerLaunch, WorkerProcesses, start_program
    from elastic_run.agent.warm.policy import WarmStarts
    from tests.integration.guardian_targets import start_grandchildren_then_wait

    def freeze(sid):
        # The agent thread descheduled between the spawn and the registration, for good.
        (mark_dir / "window.tmp").write_text(f"{sid} {guardian.pid} {warm.zygote_pid or 0}")
        os.rename(mark_dir / "window.tmp", mark_dir / "window.pids")
        threading.Event().wait()

    if __name__ == "__main__":
        mark_dir, mode = Path(sys.argv[1]), sys.argv[2]
        guardian = Guardian()
        guardian.start()
        env = guardian.worker_env(os.environ)
        argv = (sys.executable, "-u", TARGETS_PATH, str(mark_dir))
        warm = WarmStarts(enabled=mode == "warm", preload=(), emit=lambda *a: None)
        start = None
        if mode == "warm":
            warm.begin(argv, sys.executable, os.getcwd(), env)
            warm.before_attempt()
            start = warm.start_for(argv, env)
            assert start is not None, "the worker would start cold"
        elif mode in ("fork", "spawn"):
            functions = FunctionWorkers(
                start_grandchildren_then_wait, (str(mark_dir),), mode, guardian=lambda: guardian
            )
            functions.prepare_attempt()
            start = functions.start
        guardian.register = freeze
        WorkerProcesses([
            WorkerLaunch(
                local_rank=0, global_rank=0, argv=argv, env=env, log_dir=None,
                redirect=Std.NONE, tee=Std.NONE, show_on_console=True,
                error_file=mark_dir / "error.json", start=start,
            )
        ], guardian=guardian).start()
"""


@pytest.mark.parametrize("mode", ["cold", "warm", "fork", "spawn"])
def test_an_agent_killed_before_it_registered_its_worker_leaves_nothing(
    tmp_path: Path, leftovers: list[int], mode: str
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(FROZEN_AGENT).replace("TARGETS_PATH", repr(str(TARGETS))))
    agent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), mode],
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        cwd=tmp_path,
        start_new_session=True,
    )
    leftovers.append(agent.pid)
    try:
        window = _pids(tmp_path / "window.pids")  # the worker's sid, the guardian, the zygote
        helpers = [p for p in window[1:] if p]
        leftovers += helpers
        grandchildren = _pids(tmp_path / "grandchildren.pids")
        leftovers += grandchildren
        assert grandchildren[0] == window[0] and all(is_alive(p) for p in grandchildren)

        agent.kill()
        assert agent.wait(START_S) == -signal.SIGKILL

        wait_until(
            lambda: no_process_left(grandchildren + helpers),
            START_S,
            message=lambda: f"left alive: {[p for p in grandchildren + helpers if is_alive(p)]}",
        )
    finally:
        agent.kill()
        agent.wait()
