"""A completed round's numbers for this node's workers: their ranks and their store.

- ``assign_ranks``: each worker's RANK, ROLE_RANK, WORLD_SIZE and ROLE_WORLD_SIZE, from the
  dynamic rendezvous's assignment (computed from the seal alone), or, for a torch-style handler
  without one, by every node publishing its local world size in the round's store and reading
  all of them (torch's way).
- ``share_workers_store``: node 0 hosts a fresh TCPStore for the round's workers (so stale keys
  of a previous attempt never reach them) and publishes ``host:port``; the others read it. A
  value that is not ``host:port`` is a RendezvousStateError naming the key, not a traceback.
- ``wait_keys``: a store wait in short slices, so the caller can give up between them (a
  signal, the round ended).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from elastic_run.agent.api import WorkerGroup
from elastic_run.errors import AgentError
from elastic_run.rendezvous.api import Assignment
from elastic_run.rendezvous.errors import RendezvousStateError, RendezvousTimeoutError

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = [
    "MASTER_KEY",
    "assign_ranks",
    "load_torch_distributed",
    "share_workers_store",
    "wait_keys",
]

MASTER_KEY = "workers-store"
_SIZES_TIMEOUT_S = 600.0
_MASTER_TIMEOUT_S = 120.0


def wait_keys(
    store: Store,
    keys: list[str],
    timeout_s: float,
    slice_s: float = 0.5,
    give_up: Callable[[], None] | None = None,
) -> bool:
    """Wait for ``keys`` in short slices; ``give_up()`` runs between slices and may raise.

    Returns:
        Whether every key exists.
    """
    from torch.distributed import DistNetworkError, DistStoreError

    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=max(0.001, min(slice_s, left))))
            return True
        except DistNetworkError:
            raise
        except (DistStoreError, RendezvousTimeoutError):
            pass  # this slice timed out (torch's stores; our EtcdStore is both)
        if time.monotonic() >= deadline:
            return False
        if give_up is not None:
            give_up()


def assign_ranks(
    group: WorkerGroup, assignment: Assignment | None, interrupted: Callable[[], bool]
) -> None:
    """Set each worker's ranks and world sizes for the round the group just joined.

    Raises:
        AgentError: without an assignment, not every node published its size in time.
    """
    spec = group.spec
    assert group.store is not None and group.group_rank is not None
    if assignment is not None:
        offset, total = assignment.rank_offset, assignment.total_workers
        role_offset, role_total = assignment.role_offset, assignment.role_total
    else:
        store, rank, n = group.store, group.group_rank, group.group_world_size or 1
        store.set(f"lws/{rank}", f"{spec.local_world_size}:{spec.role}")
        keys = [f"lws/{i}" for i in range(n)]

        def give_up() -> None:
            if interrupted():
                from elastic_run.rendezvous.errors import RendezvousInterruptedError

                raise RendezvousInterruptedError("interrupted by a signal")

        if not wait_keys(store, keys, _SIZES_TIMEOUT_S, give_up=give_up):
            raise AgentError(
                f"not every node published its local world size in {_SIZES_TIMEOUT_S:.0f} s"
            )
        sizes = [bytes(store.get(k)).decode().split(":", 1) for k in keys]
        counts = [int(count) for count, _ in sizes]
        offset, total = sum(counts[:rank]), sum(counts)
        role_offset = sum(int(c) for c, role in sizes[:rank] if role == spec.role)
        role_total = sum(int(c) for c, role in sizes if role == spec.role)
    for w in group.workers:
        w.global_rank = offset + w.local_rank
        w.role_rank = role_offset + w.local_rank
        w.world_size = total
        w.role_world_size = role_total
        w.id = None


def _parse_master(raw: bytes) -> tuple[str, int]:
    text = raw.decode("utf-8", "replace")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise RendezvousStateError(
            f"the value under the round key '{MASTER_KEY}' is not host:port ({raw[:60]!r})"
        )
    return host, int(port_text)


def load_torch_distributed() -> None:
    """Import ``torch.distributed`` (the workers' store needs it) now, not when a round forms.

    The first import takes seconds and holds the GIL for most of them (its shared libraries load
    and initialize under it): an agent that imported it once its round had formed starved its
    own threads meanwhile, and under load its etcd lease (TTL 2 s in the partition tests) was
    not refreshed for 2.4-2.8 s and lapsed, so the other nodes judged it gone. Called before
    the agent joins; a no-op once imported.
    """
    import torch.distributed  # noqa: F401


def share_workers_store(
    store: Store, group_rank: int, addr: str, give_up: Callable[[], None]
) -> tuple[str, int, Any]:
    """Node 0 hosts the round's workers' store; every node learns where.

    Args:
        store: the round's private store.
        group_rank: this node's rank.
        addr: the address this node advertises.
        give_up: called between wait slices; raises to stop waiting.

    Returns:
        ``(host, port, server)``: where the workers connect, and the TCPStore this node hosts
        (None on the other nodes); keep the server alive for the round.

    Raises:
        AgentError: the store cannot be hosted, or node 0 did not publish it in time.
        RendezvousStateError: the published value is not ``host:port``.
    """
    from torch.distributed import TCPStore

    if group_rank == 0:
        try:
            server = TCPStore(
                "0.0.0.0" if addr not in ("localhost", "127.0.0.1") else addr,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=60),
            )
        except RuntimeError as exc:
            raise AgentError(f"cannot host the workers' store: {exc}") from exc
        store.set(MASTER_KEY, f"{addr}:{server.port}")
        return addr, int(server.port), server
    if not wait_keys(store, [MASTER_KEY], _MASTER_TIMEOUT_S, give_up=give_up):
        raise AgentError(
            f"node 0 of the round did not publish the workers' store in {_MASTER_TIMEOUT_S:.0f} s"
        )
    host, port = _parse_master(bytes(store.get(MASTER_KEY)))
    return host, port, None
