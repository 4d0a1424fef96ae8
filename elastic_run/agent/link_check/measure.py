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
3. an all-reduce of a table of every node's figures, so every node ends with the same ones.

Runs only in the helper process: the agent never joins a process group itself. Imports torch.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from elastic_run.agent.link_check.report import Measurement
from elastic_run.agent.link_check.schedule import DEFAULT_ROUNDS, pairings, partner_in

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


def measure(
    store: Store,
    rank: int,
    world_size: int,
    backend: str,
    size_bytes: int,
    timeout_s: float,
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
        schedule = pairings(world_size, rounds)
        # A warm-up pass, then `repeats` timed passes over every round: a node's samples are
        # spread over the whole check, so one stall of its CPU spoils one sample, not a partner.
        best = [math.inf] * world_size
        for timed in [False] + [True] * repeats:
            for pairs in schedule:
                _barrier(dev)
                partner = partner_in(pairs, rank)
                if partner is None:
                    continue
                t0 = time.perf_counter()
                _exchange(send, recv, partner, backend)
                if timed:
                    best[partner] = min(best[partner], time.perf_counter() - t0)
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
        rows = table.cpu().tolist()
    finally:
        dist.destroy_process_group()
    # Both sides timed the same exchange; the later starter's time is the transfer's own, the
    # earlier one's also holds its wait for the partner: the faster figure is the pair's.
    pair_bw = {
        (a, b): max(rows[a][b], rows[b][a])
        for a in range(world_size)
        for b in range(a + 1, world_size)
        if rows[a][b] > 0 or rows[b][a] > 0
    }
    bandwidth = [0.0] * world_size
    for (a, b), bw in pair_bw.items():
        bandwidth[a] = max(bandwidth[a], bw)
        bandwidth[b] = max(bandwidth[b], bw)
    return Measurement(
        bandwidth_bytes_per_s=tuple(float(b) for b in bandwidth),
        pairs=tuple((a, b, float(bw)) for (a, b), bw in sorted(pair_bw.items())),
        # The group's all-reduce is as fast as its slowest member saw it.
        all_reduce_bytes_per_s=float(min(row[world_size] for row in rows)),
        measure_s=time.perf_counter() - started,
    )
