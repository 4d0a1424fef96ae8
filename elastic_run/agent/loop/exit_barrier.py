"""The exit barrier: a node whose workers succeeded waits for the round's other nodes.

``RoundExit.wait_for_all`` writes ``exit-barrier/<group rank>`` in the round's store and waits for
every group rank's key (up to ``--exit-barrier-timeout``), then closes the rendezvous as
succeeded and leaves (``leave_last``). The wait also ends when the job is closed, whoever
closed it: a node whose workers finished in a round that then ended (the others re-formed
without it, for a newcomer or a lost node, and finished there) waits for keys of its old round
that nobody will write; the others' close is the end of the job for it too. It exits 0 (its
workers succeeded), as after a barrier that timed out.

Who came first, a node's finish or another node's failure (``OUTCOME_KEY``, one atomic add
each): a node whose workers all succeeded adds 1 as it reaches the barrier, a node whose workers
failed adds ``FAILED_UNIT`` as it reports the failure (:meth:`RoundExit.peers_finished`). A node that
finished never runs its workers again, so a round with it cannot form for a restart: the failing
node that finds a finish before it fails the job (``state_machine``: ``Fail(finished)``), and a
finishing node that finds a failure before it (that node went on to restart and would wait for
it) closes the job as failed instead of waiting. Either way every node learns at once; under
torchrun both wait (the barrier's timeout, then the join's).

``RoundExit.leave_last``: the node that hosts the store waits (10 s at most, for a member that
died) until the others have said they leave, so that their last reads (the closed record,
dropping their heartbeat) do not find the store gone.

The barrier works on what the loop hands it (a :class:`RoundExit`: the round's store and numbers,
and the few loop calls it needs), never on the agent itself: the run loop owns its state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_run.agent.loop.ranks import wait_keys
from elastic_run.rendezvous.errors import RendezvousError

__all__ = ["EXIT_KEY", "FAILED_UNIT", "LEFT_KEY", "OUTCOME_KEY", "RoundExit"]

log = logging.getLogger(__name__)

EXIT_KEY = "exit-barrier"
LEFT_KEY = "exit-left"
OUTCOME_KEY = "exit-outcome"
FAILED_UNIT = 1 << 24  # more than any number of nodes
_LEAVE_WAIT_S = 10.0


class _JobClosed(Exception):
    """The job was closed while this node waited at the barrier."""


@dataclass(frozen=True)
class RoundExit:
    """One node's way out of a completed round: the barrier, the outcome count, the leave.

    Args:
        store: the round's store (None before a round completed: every call does nothing).
        group_rank: this node's rank in the round.
        group_world_size: the round's number of nodes.
        hosting: whether this node hosts the store (it leaves last).
        interrupted: raises ``RendezvousInterruptedError`` when a signal asks the loop to stop.
        closed_now: the job's closed reason as the loop last polled it (None: open).
        close: closes the rendezvous with a reason (``succeeded`` or ``failed``).
        leave_rendezvous: leaves the rendezvous (drops this node's heartbeat).
    """

    store: Any
    group_rank: int | None
    group_world_size: int | None
    hosting: bool
    interrupted: Callable[[], None]
    closed_now: Callable[[], str | None]
    close: Callable[[str], None]
    leave_rendezvous: Callable[[], object]

    def _in_round(self) -> bool:
        return (
            self.store is not None and self.group_rank is not None and bool(self.group_world_size)
        )

    def wait_for_all(self, timeout_s: float) -> None:
        """Wait for every node of the round to finish (or the job to close), then close and
        leave. Errors of the store are logged: a finished node exits 0 whatever happens here."""
        if not self._in_round():
            return
        keys = [f"{EXIT_KEY}/{i}" for i in range(self.group_world_size or 0)]

        def give_up() -> None:
            self.interrupted()
            closed = self.closed_now()
            if closed is not None:
                raise _JobClosed(closed)

        try:
            self.store.set(f"{EXIT_KEY}/{self.group_rank}", "1")
            failed_before = self.store.add(OUTCOME_KEY, 1) // FAILED_UNIT
            if failed_before:
                log.warning(
                    "exit barrier: %d node(s) of this round failed before this node finished "
                    "and would restart without it: closing the job as failed",
                    failed_before,
                )
                self.close("failed")
                self.leave_last()
                return
            done = wait_keys(self.store, keys, timeout_s, give_up=give_up)
        except _JobClosed as closed:
            log.info("exit barrier: the job was closed (%s) while this node waited", closed)
            self.leave_last()
            return
        except (RuntimeError, RendezvousError) as exc:
            log.warning("exit barrier: %s", exc)
            return
        if not done:
            log.warning("exit barrier: not every node finished within %.0f s", timeout_s)
            return
        self.close("succeeded")
        self.leave_last()

    def peers_finished(self) -> int:
        """Count this node's failure; return how many nodes of the round had finished before it.

        Called once per failure of this node's workers, after it was reported. 0 when the store
        cannot say (the restart then goes on as before).
        """
        return self._add_outcome(FAILED_UNIT) % FAILED_UNIT

    def finished_so_far(self) -> int:
        """How many nodes of the round have finished (read only; 0 when the store cannot say)."""
        return self._add_outcome(0) % FAILED_UNIT

    def _add_outcome(self, amount: int) -> int:
        if self.store is None:
            return 0
        try:
            return int(self.store.add(OUTCOME_KEY, amount))
        except (RuntimeError, RendezvousError) as exc:
            log.info("exit barrier: cannot read the round's finished nodes: %s", exc)
            return 0

    def leave_last(self) -> None:
        """Say this node leaves the round; the node that hosts the store waits for the others."""
        if not self._in_round():
            return
        try:
            if not self.hosting:
                # Leave the rendezvous (drop the heartbeat) while the store is surely there.
                try:
                    self.leave_rendezvous()
                except RendezvousError as exc:
                    log.warning("leaving the rendezvous failed: %s", exc)
            self.store.set(f"{LEFT_KEY}/{self.group_rank}", "1")
            if self.hosting:
                left = [f"{LEFT_KEY}/{i}" for i in range(self.group_world_size or 0)]
                wait_keys(self.store, left, _LEAVE_WAIT_S, give_up=self.interrupted)
        except (RuntimeError, RendezvousError) as exc:
            log.info("leaving the round: %s", exc)
