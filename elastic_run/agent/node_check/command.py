"""The user's check: ``--node-check-cmd CMD``, run through the shell, judged by its exit.

One concept: a site's own health check (a DCGM diagnostic, a mount test, a script of its own)
says whether this node may join. Exit 0 is healthy; any other end is not, and the command's
first line of output (stdout and stderr together) is the reason, as it wrote it (made one line:
control characters shown as ``?``, at most 200 characters). A command cut at its time limit is
unhealthy too, and it and everything it started in its process group are killed
(:mod:`~elastic_run.agent.node_check.bounded_process`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping

from elastic_run.agent.node_check.bounded_process import BoundedRun, run_bounded
from elastic_run.agent.node_check.lines import one_line, show_seconds
from elastic_run.agent.node_check.result import CheckResult, CheckStatus

__all__ = ["NAME", "SHELL", "check_command", "judge_command"]

NAME = "command"
SHELL = "/bin/sh"


def judge_command(run: BoundedRun, timeout_s: float) -> CheckResult:
    """Turn how the command ended into the check's result (pure).

    Args:
        run: how it ended.
        timeout_s: the time it was given (for the timeout's words).

    Returns:
        ok when it exited 0 within its time, else fail with the reason.
    """
    if run.timed_out:
        stuck = f"; {run.error}" if run.error else ""
        detail = f"node check command timed out after {show_seconds(timeout_s)}{stuck}"
        return CheckResult(NAME, CheckStatus.FAIL, detail, run.duration_s)
    if run.exit_code is None:
        detail = f"node check command did not run: {run.error or 'no exit status'}"
        return CheckResult(NAME, CheckStatus.FAIL, detail, run.duration_s)
    if run.exit_code == 0:
        return CheckResult(NAME, CheckStatus.OK, "ok", run.duration_s)
    first = next((line for line in run.output.splitlines() if line.strip()), "")
    if first:
        return CheckResult(NAME, CheckStatus.FAIL, one_line(first), run.duration_s)
    if run.exit_code < 0:
        try:
            how = f"was killed by {signal.Signals(-run.exit_code).name}"
        except ValueError:
            how = f"was killed by signal {-run.exit_code}"
    else:
        how = f"exited {run.exit_code}"
    return CheckResult(
        NAME, CheckStatus.FAIL, f"node check command {how} with no output", run.duration_s
    )


def check_command(
    command: str | None,
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CheckResult:
    """Run the user's command (``/bin/sh -c CMD``, a session of its own) for at most ``timeout_s``.

    Args:
        command: the command; None: skip (``none given``).
        timeout_s: its time limit.
        env: its environment; None: the agent's.
        clock: monotonic seconds.

    Returns:
        The check's result (see :func:`judge_command`).
    """
    if command is None:
        return CheckResult(NAME, CheckStatus.SKIP, "none given", 0.0)
    run = run_bounded([SHELL, "-c", command], timeout_s, env=env, clock=clock)
    return judge_command(run, timeout_s)
