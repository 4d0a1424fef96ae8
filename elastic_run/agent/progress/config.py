"""What the agent does with progress beats, fixed for the run: ``--hang-timeout``,
``--straggler-factor``, ``--max-no-progress-restarts``, ``--script-exit-timeout`` and
``--no-auto-progress``, parsed once at the edge."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from elastic_run.agent.rules.progress.beats import HangRule, parse_hang_timeout
from elastic_run.agent.rules.progress.script_end import (
    DEFAULT_SCRIPT_EXIT_TIMEOUT_S,
    parse_script_exit_timeout,
)
from elastic_run.agent.rules.progress.step_times import DEFAULT_FACTOR

__all__ = ["ProgressOptions", "parse_straggler_factor"]


@dataclass(frozen=True)
class ProgressOptions:
    """The progress options of a run.

    Attributes:
        hang: when a silent worker is hung (``--hang-timeout``: auto, auto:FLOOR, off, S).
        straggler_factor: a rank whose step time stays at or above this many times the job's
            median is reported as a straggler (``--straggler-factor``, > 1).
        max_no_progress_restarts: stop with exit code 5 once this many failed attempts in a row,
            each after a restart, made no progress: none reached a step beyond the furthest
            step an earlier attempt reached (0: never; see ``hang.count_attempt``).
        script_exit_timeout_s: how long a worker's process may outlive its script's end before
            it is killed (its exit then counted as the script's own; None: never).
        auto_progress: Python workers beat once per optimizer step without code
            (``--no-auto-progress`` turns it off; see :mod:`elastic_run.worker.auto_progress`).
    """

    hang: HangRule = field(default_factory=HangRule)
    straggler_factor: float = DEFAULT_FACTOR
    max_no_progress_restarts: int = 0
    script_exit_timeout_s: float | None = DEFAULT_SCRIPT_EXIT_TIMEOUT_S
    auto_progress: bool = True

    @classmethod
    def parse(
        cls,
        hang_timeout: str,
        straggler_factor: float,
        max_no_progress_restarts: int,
        script_exit_timeout: str = "60",
        auto_progress: bool = True,
    ) -> ProgressOptions:
        """Build the options from the flags' values.

        Raises:
            ValueError: a value is out of range, naming its flag.
        """
        try:
            rule = parse_hang_timeout(hang_timeout)
        except ValueError as exc:
            raise ValueError(f"--hang-timeout {exc}") from None
        if max_no_progress_restarts < 0:
            raise ValueError(
                f"--max-no-progress-restarts must be 0 (off) or more, got {max_no_progress_restarts}"
            )
        try:
            script_exit = parse_script_exit_timeout(script_exit_timeout)
        except ValueError as exc:
            raise ValueError(f"--script-exit-timeout {exc}") from None
        return cls(
            rule,
            parse_straggler_factor(straggler_factor),
            max_no_progress_restarts,
            script_exit,
            auto_progress,
        )


def parse_straggler_factor(value: float) -> float:
    """Check ``--straggler-factor``: finite and above 1.

    Raises:
        ValueError: it is not.
    """
    if not (math.isfinite(value) and value > 1.0):
        raise ValueError(f"--straggler-factor must be a number above 1, got {value}")
    return float(value)
