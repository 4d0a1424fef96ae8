"""The node check: the three checks in turn, within one budget, into one result.

One concept: the entry point the agent calls before its node joins (:func:`run_node_check`).
The checks run in this order: ``devices``, ``disk``, ``command`` (the order of the start-up
line). They share
``--node-check-timeout``: each is given what is left of it, and a check that starts with
nothing left fails (``no time left of the 30 s node check``). The first failure ends the check:
the rest are ``skip`` (``not run: an earlier check failed``), so an unfit node leaves at once.
Every process a check starts is gone when it returns (``bounded_process``); the disk read, the
one thing that runs on a thread, is waited for only until the deadline.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from elastic_run.agent.node_check import command as command_check
from elastic_run.agent.node_check import device_check, disk
from elastic_run.agent.node_check.device_request import DeviceRequest
from elastic_run.agent.node_check.lines import show_seconds
from elastic_run.agent.node_check.options import NodeCheckOptions
from elastic_run.agent.node_check.result import CheckResult, CheckStatus, NodeCheckResult

__all__ = ["CHECK_ORDER", "run_node_check"]

CHECK_ORDER = (device_check.NAME, disk.NAME, command_check.NAME)
"""The checks, in the order they run."""


def run_node_check(
    options: NodeCheckOptions,
    devices: DeviceRequest,
    log_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    clock: Callable[[], float] = time.monotonic,
) -> NodeCheckResult:
    """Check this node before it joins: its devices, its log directory's disk, the user's command.

    Args:
        options: what to check, and the budget (``options.enabled`` False: nothing is run, and
            the result says the check was off).
        devices: the devices the flags ask for (``device_request``; ``NOTHING`` on a CPU-only
            node: the device check skips).
        log_dir: the job's log directory (it need not exist yet: its nearest parent's disk).
        env: the environment of the children (the probe, the user's command); None: the
            agent's.
        python: the interpreter that runs the device probe (it must import torch).
        clock: monotonic seconds.

    Returns:
        The result: ``healthy``, its ``reason``, each check's result and the time it took
        (:func:`~elastic_run.agent.node_check.lines.startup_line` and ``failure_line`` make the
        agent's line of it).
    """
    if not options.enabled:
        return NodeCheckResult(checks=(), duration_s=0.0, enabled=False)
    start = clock()
    deadline = start + options.timeout_s

    def run(name: str) -> CheckResult:
        left = deadline - clock()
        if left <= 0:
            spent = show_seconds(options.timeout_s)
            return CheckResult(
                name, CheckStatus.FAIL, f"no time left of the {spent} node check", 0.0
            )
        if name == disk.NAME:
            return disk.check_disk(log_dir, options.min_free_bytes, left, clock=clock)
        if name == device_check.NAME:
            return device_check.check_devices(devices, left, python=python, env=env, clock=clock)
        return command_check.check_command(options.command, left, env=env, clock=clock)

    results: list[CheckResult] = []
    for name in CHECK_ORDER:
        if any(r.failed for r in results):
            results.append(
                CheckResult(name, CheckStatus.SKIP, "not run: an earlier check failed", 0.0)
            )
        else:
            results.append(run(name))
    return NodeCheckResult(checks=tuple(results), duration_s=clock() - start)
