"""What the agent shows of itself: a read-only picture taken on demand (for the live view)."""

from __future__ import annotations

from dataclasses import dataclass

from elastic_run.agent.loop.goodput import GoodputAccount

__all__ = ["AgentSnapshot", "JobProgress", "WorkerProgress", "WorkerSnapshot"]


@dataclass(frozen=True)
class WorkerProgress:
    """One local worker's progress beats and the verdicts on them.

    Attributes:
        beats: progress beats so far this attempt (0: none yet).
        step: its last named step (-1: none).
        step_time_s: the mean gap between its beats lately (None: not known yet).
        work_time_s: its own work per step (beat to ``sync_point()``), or the step time.
        last_beat_age_s: seconds since its last beat (None: never beat).
        timeout_s: the silence after which it is hung (learned or given; None: never judged,
            the rule is off or it has not beaten yet).
        verdict: ``""``, ``"silent"`` (past its timeout, being looked at), ``"hung"``.
        where: where it was last seen stuck (``all_reduce at train.py:88``), or ``""``.
    """

    beats: int = 0
    step: int = -1
    step_time_s: float | None = None
    work_time_s: float | None = None
    last_beat_age_s: float | None = None
    timeout_s: float | None = None
    verdict: str = ""
    where: str = ""


@dataclass(frozen=True)
class WorkerSnapshot:
    """One local worker.

    Attributes:
        local_rank: the rank on this node.
        rank: the global rank (-1 before the first round).
        pid: the process id (None when not started).
        state: ``INIT``, ``HEALTHY``, ``SUCCEEDED``, ``FAILED``, ``STOPPED``.
        exitcode: the exit code once it exited (negative: killed by that signal).
        progress: its progress beats, when the agent watches them.
    """

    local_rank: int
    rank: int
    pid: int | None
    state: str
    exitcode: int | None = None
    progress: WorkerProgress | None = None


@dataclass(frozen=True)
class JobProgress:
    """The job's step times as the node of group rank 0 last published them.

    Attributes:
        median_s: the median step (or work) time over the job's ranks.
        ranks: how many ranks reported one.
        slowest: (rank, time in s, ratio to the median), slowest first.
        stragglers: the ranks reported as stragglers.
    """

    median_s: float | None
    ranks: int
    slowest: tuple[tuple[int, float, float], ...] = ()
    stragglers: tuple[int, ...] = ()


@dataclass(frozen=True)
class AgentSnapshot:
    """The agent as a whole.

    Attributes:
        run_id: the job id.
        backend: the rendezvous backend name.
        endpoint: the rendezvous endpoint.
        state: the worker group state (``INIT``, ``HEALTHY``, ``SUCCEEDED``, ``FAILED``,
            ``STOPPED``) or ``RENDEZVOUS`` while joining.
        round: the rendezvous round (-1 before the first).
        group_rank: this node's rank in the round (-1 before the first).
        group_world_size: the number of nodes in the round.
        world_size: the number of workers in the job.
        restarts: restarts used so far.
        max_restarts: restarts allowed.
        workers: the local workers.
        job_progress: the job's step times (None: not published).
        goodput: where this node's wall time went so far (None: the loop has not run yet).
        watchdog_expiries: workers of this attempt the file-timer watchdog killed.
        node_health: this node's health: ``ok``, ``suspect (1 of 2: <evidence>)`` or
            ``excluded: <reason>``.
        excluded_nodes: the other nodes excluded during the job (one line each), as read when
            the run ended.
    """

    run_id: str
    backend: str
    endpoint: str
    state: str
    round: int
    group_rank: int
    group_world_size: int
    world_size: int
    restarts: int
    max_restarts: int
    workers: tuple[WorkerSnapshot, ...] = ()
    job_progress: JobProgress | None = None
    goodput: GoodputAccount | None = None
    watchdog_expiries: int = 0
    node_health: str = "ok"
    excluded_nodes: tuple[str, ...] = ()
