"""The exit barrier: a node whose workers succeeded waits for the round's other nodes.

``exit_barrier(agent)`` writes ``exit-barrier/<group rank>`` in the round's store and waits for
every group rank's key (up to ``--exit-barrier-timeout``), then closes the rendezvous as
succeeded and leaves (``leave_last``). The wait also ends when the job is closed, whoever
closed it: a node whose workers finished in a round that then ended (the others re-formed
without it, for a newcomer or a lost node, and finished there) waits for keys of its old round
that nobody will write; the others' close is the end of the job for it too. It exits 0 (its
workers succeeded), as after a barrier that timed out.

Who came first, a node's finish or another node's failure (``OUTCOME_KEY``, one atomic add
each): a node whose workers all succeeded adds 1 as it reaches the barrier, a node whose workers
failed adds ``FAILED_UNIT`` as it reports the failure (:func:`peers_finished`). A node that
finished never runs its workers again, so a round with it cannot form for a restart: the failing
node that finds a finish before it fails the job (``state_machine``: ``Fail(finished)``), and a
finishing node that finds a failure before it (that node went on to restart and would wait for
it) closes the job as failed instead of waiting. Either way every node learns at once; under
torchrun both wait (the barrier's timeout, then the join's).

``leave_last(agent)``: the node that hosts the store waits (10 s at most, for a member that
died) until the others have said they leave, so that their last reads (the closed record,
dropping their heartbeat) do not find the store gone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from elastic_run.agent.ranks import wait_keys
from elastic_run.rendezvous.errors import RendezvousError

if TYPE_CHECKING:
    from elastic_run.agent.simple import SimpleElasticAgent

__all__ = [
    "EXIT_KEY",
    "FAILED_UNIT",
    "LEFT_KEY",
    "OUTCOME_KEY",
    "exit_barrier",
    "finished_so_far",
    "leave_last",
    "peers_finished",
]

log = logging.getLogger(__name__)

EXIT_KEY = "exit-barrier"
LEFT_KEY = "exit-left"
OUTCOME_KEY = "exit-outcome"
FAILED_UNIT = 1 << 24  # more than any number of nodes
_LEAVE_WAIT_S = 10.0


class _JobClosed(Exception):
    """The job was closed while this node waited at the barrier."""


def exit_barrier(agent: SimpleElasticAgent) -> None:
    """Wait for every node of the round to finish (or the job to close), then close and leave."""
    group = agent._worker_group
    store = group.store
    if store is None or group.group_rank is None or group.group_world_size is None:
        return
    keys = [f"{EXIT_KEY}/{i}" for i in range(group.group_world_size)]

    def give_up() -> None:
        agent._interrupted()
        closed = agent._poll_store().closed
        if closed is not None:
            raise _JobClosed(closed)

    try:
        store.set(f"{EXIT_KEY}/{group.group_rank}", "1")
        failed_before = store.add(OUTCOME_KEY, 1) // FAILED_UNIT
        if failed_before:
            log.warning(
                "exit barrier: %d node(s) of this round failed before this node finished and "
                "would restart without it: closing the job as failed",
                failed_before,
            )
            agent._close_rendezvous("failed")
            leave_last(agent)
            return
        done = wait_keys(store, keys, agent._exit_barrier_timeout, give_up=give_up)
    except _JobClosed as closed:
        log.info("exit barrier: the job was closed (%s) while this node waited", closed)
        leave_last(agent)
        return
    except (RuntimeError, RendezvousError) as exc:
        log.warning("exit barrier: %s", exc)
        return
    if not done:
        log.warning(
            "exit barrier: not every node finished within %.0f s", agent._exit_barrier_timeout
        )
        return
    agent._close_rendezvous("succeeded")
    leave_last(agent)


def peers_finished(agent: SimpleElasticAgent) -> int:
    """Count this node's failure; return how many nodes of the round had finished before it.

    Called once per failure of this node's workers, after it was reported. 0 when the store
    cannot say (the restart then goes on as before).
    """
    return _add_outcome(agent, FAILED_UNIT) % FAILED_UNIT


def finished_so_far(agent: SimpleElasticAgent) -> int:
    """How many nodes of the round have finished (read only; 0 when the store cannot say)."""
    return _add_outcome(agent, 0) % FAILED_UNIT


def _add_outcome(agent: SimpleElasticAgent, amount: int) -> int:
    store = agent._worker_group.store
    if store is None:
        return 0
    try:
        return int(store.add(OUTCOME_KEY, amount))
    except (RuntimeError, RendezvousError) as exc:
        log.info("exit barrier: cannot read the round's finished nodes: %s", exc)
        return 0


def leave_last(agent: SimpleElasticAgent) -> None:
    """Say this node leaves the round; the node that hosts the store waits for the others."""
    group = agent._worker_group
    store = group.store
    if store is None or group.group_rank is None or group.group_world_size is None:
        return
    hosting = agent._rdzv.is_hosting if agent._rdzv is not None else False
    try:
        if not hosting:
            # Leave the rendezvous (drop the heartbeat) while the store is surely there.
            try:
                agent._spec.rdzv_handler.shutdown()
            except RendezvousError as exc:
                log.warning("leaving the rendezvous failed: %s", exc)
        store.set(f"{LEFT_KEY}/{group.group_rank}", "1")
        if hosting:
            left = [f"{LEFT_KEY}/{i}" for i in range(group.group_world_size)]
            wait_keys(store, left, _LEAVE_WAIT_S, give_up=agent._interrupted)
    except (RuntimeError, RendezvousError) as exc:
        log.info("leaving the round: %s", exc)
