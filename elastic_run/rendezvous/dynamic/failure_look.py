"""The look before a worker failure counts: is a member of the round lost behind it?

When a member's agent dies, its workers' peers fail in their collectives at once, often before
any watcher has judged it. Counted, such a failure spends one of this node's restarts for a
loss that is nobody's restart (or, with the restarts used up, ends the whole job with exit 1).
So every worker failure is looked at first (:meth:`FailureLook.member_lost`): a failure within
the heartbeat budget of a member's loss waits for the verdict.

    the round already ended as member_lost (seen, or its end record)  -> lost: the failure
                                                                         does not count
    a round of at most _PROBE_MAX other members: each one's liveness
    port is asked once, all within _PROBE_BUDGET_S                     -> all greet: not lost,
                                                                         no wait
    a larger round with restarts left (``blind`` false): nobody is
    asked, nothing is waited for (every failure there would wait the
    whole look; the ring's watchers judge)                             -> not lost: it counts
    the members that did not greet (or, in a larger round on the last
    restart, nobody asked: the ring's watchers judge) are watched by
    heartbeat, once an interval, and the round's end record read every
    _END_LOOK_S, until twice the heartbeat budget plus one interval     -> judged gone here, or
                                                                         ended elsewhere as
                                                                         member_lost: it does
                                                                         not count
    the time is up, the agent's interrupt check turned true, or the
    node shuts down                                                    -> not lost: it counts

Every wait goes through the handler's clock on the handler's condition, which is notified
whenever the node's round state changes (a watcher's verdict, the epoch read) and when the node
shuts down: a verdict reached elsewhere ends the look at once, and a fake clock drives the look
in a logic test. The end record is read more often than the heartbeats (which are judged by
reads one interval apart): the member that watches the lost one writes its verdict within
milliseconds of a death notice, and this node's next round waits on this look. The probes run
on a small thread pool (a greeting read is a blocking call); their budget is measured on the
same clock.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from elastic_run.clock import Clock
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.dynamic.coordinator import read_lost
from elastic_run.rendezvous.dynamic.round_state import RoundState
from elastic_run.rendezvous.dynamic.rounds import Membership
from elastic_run.rendezvous.dynamic.rounds import end_round as end_round_in_store
from elastic_run.rendezvous.liveness.peerwatch import answers
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import LostRecord, NodeRecord, decode
from elastic_run.rendezvous.settings import RendezvousSettings

__all__ = ["FailureLook"]

log = logging.getLogger(__name__)

# How long one member's liveness port may take to greet, how many are asked at once, how long
# the asking may take in all (those not asked by then count as silent), and the largest round
# whose members are asked (N nodes asking N each would flood every listener).
_ANSWER_TIMEOUT_S = 1.0
_PROBES = 16
_PROBE_BUDGET_S = 2.0
_PROBE_MAX = 64
# How often the look reads the round's end record (one key) between two heartbeat reads.
_END_LOOK_S = 0.25


class FailureLook:
    """One node's look at its round before a job-ending failure counts (module docstring).

    Args:
        backend: the job's backend.
        run_id: the job id (for messages).
        node_id: this node's id.
        settings: the timing (the heartbeat budget and interval).
        clock: the clock every wait is measured on.
        state: this node's round state (read, and told of an end found here).
        with_notices: applies this node's death notices to a heartbeat view.
        is_interrupted: the agent's interrupt check (None: none installed).
        changed: notified when the round state changes or the node shuts down.
        is_stopping: whether the node shuts down.
        end_round: ends round ``r`` with a verdict's record and tells the round's other
            members (the handler's; default: the store alone, ``rounds.end_round``).
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        run_id: str,
        node_id: str,
        settings: RendezvousSettings,
        clock: Clock,
        state: RoundState,
        with_notices: Callable[[proto.Heartbeats, float], proto.Heartbeats],
        is_interrupted: Callable[[], bool],
        changed: threading.Condition,
        is_stopping: Callable[[], bool],
        end_round: Callable[[int, LostRecord], bool] | None = None,
    ) -> None:
        self._backend = backend
        self._run_id = run_id
        self._node_id = node_id
        self._settings = settings
        self._clock = clock
        self._state = state
        self._with_notices = with_notices
        self._is_interrupted = is_interrupted
        self._changed = changed
        self._is_stopping = is_stopping
        self._end_round = end_round or (lambda r, why: end_round_in_store(backend, r, why))

    @property
    def wait_s(self) -> float:
        """The longest look: twice the heartbeat budget plus one interval.

        Twice the budget: a judge needs the budget and its reads, which slip on a busy host.
        """
        s = self._settings
        return 2 * s.stale_after_s + s.keep_alive_interval_s

    def member_lost(self, member: Membership, blind: bool = True) -> bool:
        """Whether a member of ``member``'s round is lost (see the module docstring).

        Args:
            member: this node's membership of the round its workers failed in.
            blind: in a round too large to ask every member, watch for the look's whole time
                anyway (the failure would end the job); when false, such a failure counts at
                once.

        Raises:
            RendezvousError: the store failed while looking (the caller counts the failure).
        """
        r = member.round
        if self._state.poll().member_lost:
            return True
        if self._round_ended(r):
            return self._state.poll().member_lost
        others = self._other_members(member)
        suspects: list[str] = []
        if len(others) > _PROBE_MAX and not blind:
            return False
        if len(others) <= _PROBE_MAX:
            suspects = self._unanswered(others)
            if not suspects:
                return False
        log.warning(
            "rendezvous '%s': a worker failed %s; waiting up to %.1f s for a verdict before "
            "counting the failure",
            self._run_id,
            f"while {len(suspects)} member(s) of round {r} did not answer "
            f"({', '.join(suspects[:3])}{' ...' if len(suspects) > 3 else ''})"
            if suspects
            else f"in round {r} of {len(others) + 1} nodes",
            self.wait_s,
        )
        return self._watch(r, suspects, self._clock.now() + self.wait_s)

    def _watch(self, r: int, suspects: list[str], deadline: float) -> bool:
        """Read the suspects' heartbeats once an interval until a verdict or ``deadline``."""
        settings = self._settings
        beats = proto.Heartbeats(min_reads=settings.keep_alive_max_attempt)
        step_s = min(settings.keep_alive_interval_s, _END_LOOK_S)
        next_beats = self._clock.now()
        while True:
            if self._is_interrupted() or self._is_stopping():
                return False
            if self._round_ended(r):
                return self._state.poll().member_lost
            now = self._clock.now()
            if suspects and now >= next_beats:
                next_beats = now + settings.keep_alive_interval_s
                read = self._backend.read_heartbeats(suspects)
                beats = self._with_notices(
                    beats.observe(dict(zip(suspects, read, strict=True)), now), now
                )
                verdict = proto.judge_watched(suspects, beats, now, settings.stale_after_s)
                if isinstance(verdict, proto.MemberLost):
                    why = LostRecord(r, "member_lost", verdict.node_ids, self._node_id)
                    self._end_round(r, why)  # the others are told at once
                    self._state.note_round_end(r)
                    return self._state.poll().member_lost
            if now >= deadline:
                return False
            with self._changed:
                self._clock.wait(
                    self._changed,
                    lambda: self._state.poll().round_over or self._is_stopping(),
                    min(step_s, deadline - now),
                )

    def _round_ended(self, r: int) -> bool:
        """Whether round ``r`` has its end record (noted in this node's round state)."""
        why = read_lost(self._backend, r)
        if why is None:
            return False
        self._state.note_end_record(r, why)
        return True

    def _other_members(self, member: Membership) -> list[NodeRecord]:
        """The records of the other members of ``member``'s round."""
        r = member.round
        node_keys = [keys.node(r, i) for i in member.seal.admitted_indices()]
        records = [
            decode(NodeRecord, k, raw)
            for k, raw in zip(node_keys, self._backend.get_unwaited(node_keys), strict=True)
            if raw is not None
        ]
        return [rec for rec in records if rec.node_id != self._node_id]

    def _unanswered(self, others: list[NodeRecord]) -> list[str]:
        """The members of ``others`` whose liveness port did not greet within the budget."""
        if not others:
            return []
        order = random.sample(others, len(others))  # not every node asking the same one first
        asked = [rec for rec in order if rec.alive_port]
        if not asked:
            return [rec.node_id for rec in order]
        done = threading.Condition()
        finished: list[Future[bool]] = []

        def note(future: Future[bool]) -> None:
            with done:
                finished.append(future)
                done.notify_all()

        pool = ThreadPoolExecutor(max_workers=min(_PROBES, len(asked)))
        futures: dict[Future[bool], str] = {}
        try:
            for rec in asked:
                future = pool.submit(
                    answers, rec.node_id, rec.addr, rec.alive_port, _ANSWER_TIMEOUT_S
                )
                futures[future] = rec.node_id
                future.add_done_callback(note)
            with done:
                self._clock.wait(done, lambda: len(finished) == len(futures), _PROBE_BUDGET_S)
                answered = list(finished)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        greeted = {
            futures[f]
            for f in answered
            if not f.cancelled() and f.exception() is None and f.result()
        }
        return [rec.node_id for rec in order if rec.node_id not in greeted]
