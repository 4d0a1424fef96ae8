"""What the agent shows of itself: a read-only picture taken on demand (for the live view)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AgentSnapshot", "WorkerSnapshot"]


@dataclass(frozen=True)
class WorkerSnapshot:
    """One local worker.

    Attributes:
        local_rank: the rank on this node.
        rank: the global rank (-1 before the first round).
        pid: the process id (None when not started).
        state: ``INIT``, ``HEALTHY``, ``SUCCEEDED``, ``FAILED``, ``STOPPED``.
        exitcode: the exit code once it exited (negative: killed by that signal).
    """

    local_rank: int
    rank: int
    pid: int | None
    state: str
    exitcode: int | None = None


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
