"""The agent's side of the link check: start this node's helper, bound it, read its report.

``run_link_check`` starts ``helper_process.py`` as a child of the agent (its own session, a
parent-death signal, so it dies with the agent even when the agent is SIGKILLed), waits for it
in short slices (``give_up`` runs between them and may raise, e.g. on a signal), and kills it at
``timeout_s``. The agent's interpreter never joins a process group: the helper does.

Invariants:
- When ``run_link_check`` returns or raises, its helper has exited and been reaped.
- A round of fewer than two nodes starts nothing and measures nothing.
- Every failure is one ``LinkCheckError`` line: a timeout (``timed_out``), a helper that
  failed (its own line), or a record that does not decode.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from elastic_run.agent.link_check.helper_process import HelperArgs
from elastic_run.agent.link_check.measure import DEFAULT_REPEATS
from elastic_run.agent.link_check.report import LinkReport, decode_measurement
from elastic_run.agent.link_check.schedule import DEFAULT_ROUNDS
from elastic_run.agent.link_check.verdict import slow_ranks
from elastic_run.errors import AgentError
from elastic_run.parent_death import death_signal_prefix, set_parent_death_signal

__all__ = [
    "DEFAULT_SIZE_BYTES",
    "DEFAULT_TIMEOUT_S",
    "MAX_SIZE_BYTES",
    "LinkCheckError",
    "run_link_check",
]

DEFAULT_SIZE_BYTES = 4 << 20
DEFAULT_TIMEOUT_S = 60.0
MAX_SIZE_BYTES = 1 << 30
_HELPER_MODULE = "elastic_run.agent.link_check.helper_process"
_SLICE_S = 0.25


class LinkCheckError(AgentError):
    """The link check could not measure: it timed out, its helper failed, or said nonsense.

    Attributes:
        timed_out: whether the helper was cut at the timeout.
    """

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _check(
    rank: int, world_size: int, store_port: int, backend: str, size_bytes: int, timeout_s: float
) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"the link check needs 0 <= rank < world_size, got {rank}, {world_size}")
    if not 0 < store_port < 65536:
        raise ValueError(f"the link check's store port must be 1..65535, got {store_port}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"the link check runs over gloo or nccl, not {backend!r}")
    if isinstance(size_bytes, bool) or not 4 <= size_bytes <= MAX_SIZE_BYTES:
        raise ValueError(f"the link check's size must be 4 B..1 GiB, got {size_bytes}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"the link check's timeout must be a positive number, got {timeout_s}")


def _said(stderr: bytes) -> str | None:
    """The helper's own line (``link check ...``), else the last line it printed."""
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    own = [ln for ln in lines if ln.startswith("link check")]
    chosen = own[-1] if own else (lines[-1] if lines else None)
    return chosen[:300] if chosen is not None else None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate()  # reaps it and closes the pipes


def run_link_check(
    rank: int,
    world_size: int,
    store_addr: str,
    store_port: int,
    prefix: str,
    backend: str,
    size_bytes: int = DEFAULT_SIZE_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    factor: float,
    device: str | None = None,
    repeats: int = DEFAULT_REPEATS,
    rounds: int = DEFAULT_ROUNDS,
    env: Mapping[str, str] | None = None,
    give_up: Callable[[], None] | None = None,
) -> LinkReport:
    """Measure this round's links: every node of the round calls this at the same time.

    Args:
        rank: this node's rank in the round (its group rank).
        world_size: the round's node count; below 2 nothing is measured.
        store_addr: the host of a TCPStore every node of the round reaches (the round's
            workers' store: ``group.master_addr``).
        store_port: its port (``group.master_port``).
        prefix: a key prefix the same on every node and new for each formed round
            (``f"link-check/{round}/{restart_count}"``), so no check reads another's keys.
        backend: the workers' backend, ``gloo`` or ``nccl``.
        size_bytes: the bytes each exchange moves each way (default 4 MiB).
        timeout_s: the bound on the whole check, the helper's start included.
        factor: ``--straggler-factor``: slow is under ``1 / factor`` of the median.
        device: the helper's device for NCCL (default ``cuda``, i.e. its current device).
        repeats: timed passes over the rounds (each pair's best time counts).
        rounds: pairing rounds (each node meets up to this many partners).
        env: the helper's environment (default: the agent's; ``GLOO_SOCKET_IFNAME`` and
            ``NCCL_SOCKET_IFNAME`` there choose its interface as for the workers).
        give_up: called between short waits; whatever it raises stops the check (the helper
            is killed first) and propagates.

    Returns:
        The report: every node's figure, the time it took, and the slow ranks.

    Raises:
        ValueError: an argument is out of range.
        LinkCheckError: the check timed out, its helper failed, or its record is garbage.
    """
    _check(rank, world_size, store_port, backend, size_bytes, timeout_s)
    if not (math.isfinite(factor) and factor > 1.0):
        raise ValueError(f"the slow-link factor must be a number above 1, got {factor}")
    if not (1 <= repeats <= 100 and 1 <= rounds <= 1000):
        raise ValueError(
            f"the link check needs 1..100 repeats and 1..1000 rounds, got {repeats}, {rounds}"
        )
    if world_size < 2:
        return LinkReport(world_size, backend, size_bytes, (), (), 0.0, 0.0, 0.0, factor, ())
    args = HelperArgs(
        rank, world_size, store_addr, store_port, prefix, backend, size_bytes, float(timeout_s),
        repeats, rounds, device,
    )  # fmt: skip
    prefix_argv = death_signal_prefix()
    started = time.monotonic()
    deadline = started + timeout_s
    proc = subprocess.Popen(
        [*prefix_argv, sys.executable, "-m", _HELPER_MODULE, args.to_json()],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,
        preexec_fn=None if prefix_argv else set_parent_death_signal,
    )
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkCheckError(
                    f"link check on node {rank} of {world_size} timed out after "
                    f"{timeout_s:g} s (a peer never joined, or a link is down)",
                    timed_out=True,
                )
            try:
                out, err = proc.communicate(timeout=min(_SLICE_S, left))
                break
            except subprocess.TimeoutExpired:
                if give_up is not None:
                    give_up()
    finally:
        _kill(proc)
    duration_s = time.monotonic() - started
    if proc.returncode != 0:
        said = _said(err) or f"its helper exited with status {proc.returncode}"
        raise LinkCheckError(said if said.startswith("link check") else f"link check: {said}")
    lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.strip()]
    try:
        measured = decode_measurement(lines[-1] if lines else "", world_size)
    except ValueError as exc:
        raise LinkCheckError(f"link check on node {rank}: {exc}") from None
    return LinkReport(
        world_size=world_size,
        backend=backend,
        size_bytes=size_bytes,
        bandwidth_bytes_per_s=measured.bandwidth_bytes_per_s,
        pairs=measured.pairs,
        all_reduce_bytes_per_s=measured.all_reduce_bytes_per_s,
        measure_s=measured.measure_s,
        duration_s=duration_s,
        factor=factor,
        slow=slow_ranks(measured.bandwidth_bytes_per_s, factor),
    )
