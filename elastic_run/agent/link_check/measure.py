"""Inside the helper: the collectives the link check times, over one torch process group.

The helper joins a process group of the round's nodes (one helper per node) and then:

1. passes over the rounds of ``schedule.pairings``: in each round a barrier, then each node
   exchanges ``size_bytes`` with its partner both ways at once (an ``isend`` and an ``irecv``,
   NCCL's as one batch). The first pass is untimed (connections and buffers warm up), then
   ``repeats`` timed passes; a pair's figure is ``size_bytes`` over its best time. Passes rather
   than back-to-back repeats spread a node's samples over the whole check, so a stall of its
   CPU (a busy host) spoils one sample, not its figure;
2. one all-reduce of ``size_bytes``, warmed up and timed the same way (the whole group's figure,
   bounded by its slowest link);
3. an all-reduce of a table of every node's figures, so every node ends with the same ones;
4. each node then under ``1 / factor`` of the median (a suspect) is measured again, one pair at
   a time, with the fastest node while the rest wait (twice ``repeats`` timed exchanges: one
   pair alone on the machine's time, the cheapest place for more samples), and keeps the
   better figure (a max
   all-reduce of the table): a node that was only short of CPU (a busy host, or many simulated
   nodes on one machine) clears itself, a slow link stays slow.

Runs only in the helper process: the agent never joins a process group itself. Imports torch.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from elastic_run.agent.link_check.report import Measurement, figures_from_table
from elastic_run.agent.link_check.schedule import DEFAULT_ROUNDS, pairings, partner_in
from elastic_run.agent.link_check.verdict import slow_ranks

if TYPE_CHECKING:
    import torch
    from torch.distributed import Store

__all__ = ["DEFAULT_REPEATS", "measure"]

DEFAULT_REPEATS = 3


def _settle(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(device: torch.device) -> None:
    import torch
    import torch.distributed as dist

    one = torch.ones(1, device=device)
    dist.all_reduce(one)
    _settle(device)


def _exchange(send: torch.Tensor, recv: torch.Tensor, partner: int, backend: str) -> None:
    import torch.distributed as dist

    works: list[Any]
    if backend == "nccl":
        ops = [dist.P2POp(dist.isend, send, partner), dist.P2POp(dist.irecv, recv, partner)]
        works = list(dist.batch_isend_irecv(ops))
    else:
        works = [dist.isend(send, partner), dist.irecv(recv, partner)]
    for work in works:
        work.wait()
    _settle(send.device)


def _best_time_s(run: Any, repeats: int, device: torch.device) -> float:
    run()  # warm-up, untimed
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        _settle(device)
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _timed_passes(
    send: torch.Tensor, recv: torch.Tensor, rank: int, backend: str, schedule: Any, repeats: int
) -> list[float]:
    """A warm-up pass, then ``repeats`` timed passes over every round: this node's best time
    with each partner (inf where it had none)."""
    best = [math.inf] * (max((max(p) for pairs in schedule for p in pairs), default=0) + 1)
    for timed in [False] + [True] * repeats:
        for pairs in schedule:
            _barrier(send.device)
            partner = partner_in(pairs, rank)
            if partner is None:
                continue
            t0 = time.perf_counter()
            _exchange(send, recv, partner, backend)
            if timed:
                best[partner] = min(best[partner], time.perf_counter() - t0)
    return best


def measure(
    store: Store,
    rank: int,
    world_size: int,
    backend: str,
    size_bytes: int,
    timeout_s: float,
    factor: float,
    *,
    device: str | None = None,
    repeats: int = DEFAULT_REPEATS,
    rounds: int = DEFAULT_ROUNDS,
) -> Measurement:
    """Join the round's process group through ``store``, time the exchanges, leave it.

    Args:
        store: where the helpers meet (a prefix of the workers' store, the same on every node).
        rank: this node's rank in the round.
        world_size: the round's node count (at least 2).
        backend: ``gloo`` or ``nccl``.
        size_bytes: the bytes each exchange moves each way.
        timeout_s: the process group's timeout for each collective and its set-up.
        factor: ``--straggler-factor``: a node under ``1 / factor`` of the median after the
            passes is measured again, alone with the fastest node.
        device: the tensors' device (default: ``cuda`` for NCCL, ``cpu`` otherwise).
        repeats: timed passes over the rounds (each pair's best time counts).
        rounds: how many pairing rounds (see ``schedule.py``).

    Returns:
        The figures of every node (the same on every node).

    Raises:
        RuntimeError: torch's, when a peer fails or a collective times out.
    """
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    dev = torch.device(device or ("cuda" if backend == "nccl" else "cpu"))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    try:
        send = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=dev)
        recv = torch.empty_like(send)
        moved = send.numel() * send.element_size()
        # Row r: node r's figure with each partner, then its all-reduce figure (last column).
        table = torch.zeros(world_size, world_size + 1, dtype=torch.float64, device=dev)
        best = _timed_passes(send, recv, rank, backend, pairings(world_size, rounds), repeats)
        for partner, best_s in enumerate(best):
            if math.isfinite(best_s):
                table[rank, partner] = moved / max(best_s, 1e-9)
        _barrier(dev)

        def reduce_once() -> None:
            recv.copy_(send)
            dist.all_reduce(recv)

        table[rank, world_size] = moved / _best_time_s(reduce_once, repeats, dev)
        dist.all_reduce(table)
        _settle(dev)
        _, bandwidth = figures_from_table(table.cpu().tolist(), world_size)
        suspects = slow_ranks(bandwidth, factor)
        if suspects:
            # Measured again one pair at a time with the fastest node, the rest of the round
            # idle: a node slowed by its CPU (a busy host) clears itself, a slow link does not.
            fastest = max(
                (r for r in range(world_size) if r not in suspects), key=lambda r: bandwidth[r]
            )
            for suspect in suspects:
                _barrier(dev)
                if rank in (suspect, fastest):
                    other = fastest if rank == suspect else suspect
                    again = _best_time_s(
                        lambda o=other: _exchange(send, recv, o, backend), 2 * repeats, dev
                    )
                    table[rank, other] = max(float(table[rank, other]), moved / again)
            dist.all_reduce(table, op=dist.ReduceOp.MAX)
            _settle(dev)
        rows = table.cpu().tolist()
    finally:
        dist.destroy_process_group()
    pair_bw, bandwidth = figures_from_table(rows, world_size)
    return Measurement(
        bandwidth_bytes_per_s=bandwidth,
        pairs=tuple((a, b, bw) for (a, b), bw in sorted(pair_bw.items())),
        # The group's all-reduce is as fast as its slowest member saw it.
        all_reduce_bytes_per_s=float(min(row[world_size] for row in rows)),
        measure_s=time.perf_counter() - started,
        rechecked=suspects,
    )
