"""The agent's side of the link check: one call per node once the round formed.

``run_link_check`` hands this node's helper (``helper.py``: one started early with
``LinkHelper.start``, or a fresh one) its arguments, waits for it in short slices (``give_up``
runs between them and may raise, e.g. on a signal), kills it at ``timeout_s`` and turns what it
printed into a ``LinkReport``. The agent's interpreter never joins a process group: the helper
does.

Invariants:
- When ``run_link_check`` returns or raises, its helper has exited and been reaped.
- A round of fewer than two nodes measures nothing (a helper handed in is closed unused).
- Every failure is one ``LinkCheckError`` line: a timeout (``timed_out``), a helper that
  failed (its own line), or a record that does not decode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

from elastic_run.agent.link_check.helper import LinkHelper, LinkHelperTimeout
from elastic_run.agent.link_check.helper_process import READY, HelperArgs
from elastic_run.agent.link_check.measure import DEFAULT_REPEATS
from elastic_run.agent.link_check.report import LinkReport, decode_measurement
from elastic_run.agent.link_check.schedule import DEFAULT_ROUNDS
from elastic_run.agent.link_check.verdict import slow_ranks
from elastic_run.errors import AgentError

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


def _said(stderr: str) -> str | None:
    """The helper's own line (``link check ...``), else the last line it printed."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    own = [ln for ln in lines if ln.startswith("link check")]
    chosen = own[-1] if own else (lines[-1] if lines else None)
    return chosen[:300] if chosen is not None else None


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
    helper: LinkHelper | None = None,
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
        timeout_s: the bound on the check from this call on (a fresh helper's start included).
        factor: ``--straggler-factor``: slow is under ``1 / factor`` of the median.
        helper: a helper started earlier (``LinkHelper.start``, e.g. when the agent began to
            join), so ``import torch`` is already paid; default: start one now. Used up.
        device: the helper's device for NCCL (default ``cuda``, i.e. its current device).
        repeats: timed passes over the rounds (each pair's best time counts).
        rounds: pairing rounds (each node meets up to this many partners).
        env: a fresh helper's environment (default: the agent's; ``GLOO_SOCKET_IFNAME`` and
            ``NCCL_SOCKET_IFNAME`` there choose its interface as for the workers).
        give_up: called between short waits; whatever it raises stops the check (the helper
            is killed first) and propagates.

    Returns:
        The report: every node's figure, the time it took, and the slow ranks.

    Raises:
        ValueError: an argument is out of range.
        LinkCheckError: the check timed out, its helper failed, or its record is garbage.
    """
    try:
        _check(rank, world_size, store_port, backend, size_bytes, timeout_s)
        if not (math.isfinite(factor) and factor > 1.0):
            raise ValueError(f"the slow-link factor must be a number above 1, got {factor}")
        if not (1 <= repeats <= 100 and 1 <= rounds <= 1000):
            raise ValueError(
                f"the link check needs 1..100 repeats and 1..1000 rounds, got {repeats}, {rounds}"
            )
    except ValueError:
        if helper is not None:
            helper.close()
        raise
    if world_size < 2:
        if helper is not None:
            helper.close()
        return LinkReport(world_size, backend, size_bytes, (), (), 0.0, 0.0, 0.0, factor, ())
    args = HelperArgs(
        rank, world_size, store_addr, store_port, prefix, backend, size_bytes, float(timeout_s),
        float(factor), repeats, rounds, device,
    )  # fmt: skip
    started = time.monotonic()
    try:
        if helper is None:
            helper = LinkHelper.start(env)
        helper.send(args)
        code, out, err = helper.wait(started + timeout_s, give_up)
    except LinkHelperTimeout:
        raise LinkCheckError(
            f"link check on node {rank} of {world_size} timed out after {timeout_s:g} s "
            "(a peer never joined, or a link is down)",
            timed_out=True,
        ) from None
    except AgentError as exc:
        raise LinkCheckError(f"link check on node {rank}: {exc}") from None
    finally:
        if helper is not None:
            helper.close()
    duration_s = time.monotonic() - started
    if code is not None:  # it exited without its record
        said = _said(err) or f"its helper exited with status {code}"
        raise LinkCheckError(said if said.startswith("link check") else f"link check: {said}")
    lines = [ln for ln in out.splitlines() if ln.strip() and ln.strip() != READY]
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
        rechecked=measured.rechecked,
    )
