"""The descriptor budget of the process that hosts the c10d store.

The TCPStore server holds one descriptor per client connection, in the hosting agent's process,
and each node keeps ``CONNECTIONS_PER_NODE`` connections to it (``backend.py``: the blocking
waits have their own). A job of MAX nodes therefore needs about ``CONNECTIONS_PER_NODE * MAX``
descriptors there, beyond what the agent itself holds (``SPARE_DESCRIPTORS``). (A process
that holds many simulated nodes shares their short-call links, ``short_links.py``, and needs
about one a node; the host cannot tell such processes from agents, so it counts two.) Past the soft
``RLIMIT_NOFILE`` the server cannot accept: the clients' connects are reset, from about node
``limit / 2`` on, halfway through a round that then never forms.

So the host raises its soft limit to the hard limit before it starts the server (any process may
raise its soft limit up to its hard limit), and when even the hard limit is too low for MAX nodes
says so in one line before the round, instead of the resets. Nothing here decides anything for
the job: a job with fewer nodes than MAX may well fit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = [
    "CONNECTIONS_PER_NODE",
    "SPARE_DESCRIPTORS",
    "DescriptorBudget",
    "raise_for_store",
]

log = logging.getLogger(__name__)

CONNECTIONS_PER_NODE = 2
# What the hosting agent holds beside the store's connections: its own files and sockets, its
# workers' pipes and logs, the health server, the death-notice sockets.
SPARE_DESCRIPTORS = 256


@dataclass(frozen=True)
class DescriptorBudget:
    """The hosting process's descriptor limits, after ``raise_for_store``.

    Attributes:
        soft: the soft ``RLIMIT_NOFILE`` now in force.
        hard: the hard limit.
        before: the soft limit before it was raised (equal to ``soft`` when it was not).
        max_nodes: the job's MAX.
        needed: the descriptors MAX nodes need here.
    """

    soft: int
    hard: int
    before: int
    max_nodes: int
    needed: int

    @property
    def fits(self) -> bool:
        """Whether MAX nodes' connections fit under the soft limit."""
        return self.soft >= self.needed

    @property
    def nodes_that_fit(self) -> int:
        """About how many nodes' connections the soft limit leaves room for."""
        return max(0, (self.soft - SPARE_DESCRIPTORS) // CONNECTIONS_PER_NODE)

    def shortfall(self, endpoint: str) -> str | None:
        """The one line that says MAX nodes do not fit, or None when they do."""
        if self.fits:
            return None
        return (
            f"the c10d rendezvous store hosted here ({endpoint}) has room for about "
            f"{self.nodes_that_fit} nodes, not --nnodes max {self.max_nodes}: each node keeps "
            f"{CONNECTIONS_PER_NODE} connections and this process may open {self.soft} "
            f"descriptors (its hard limit, RLIMIT_NOFILE), {self.needed} are needed; nodes past "
            "that are refused. Raise the hard limit (ulimit -Hn, systemd LimitNOFILE=) or use "
            "--rdzv-backend etcd"
        )


def _needed(max_nodes: int) -> int:
    return CONNECTIONS_PER_NODE * max_nodes + SPARE_DESCRIPTORS


def raise_for_store(max_nodes: int) -> DescriptorBudget:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; report the budget.

    A hard limit of ``RLIM_INFINITY`` raises the soft one to what MAX nodes need (at least). A
    limit the kernel refuses (``setrlimit`` fails) is left as it was, and reported as it is.

    Args:
        max_nodes: the job's MAX.

    Returns:
        The limits now in force and what MAX nodes need.
    """
    import resource

    needed = _needed(max_nodes)
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    target = hard if hard != infinite else max(before, needed)
    soft = before
    if before != infinite and target > before:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.info(
                "could not raise the soft descriptor limit from %d to %d: %s", before, target, exc
            )
    if soft == infinite:
        soft = max(needed, 1 << 30)
    return DescriptorBudget(
        soft=soft,
        hard=hard if hard != infinite else soft,
        before=before if before != infinite else soft,
        max_nodes=max_nodes,
        needed=needed,
    )
