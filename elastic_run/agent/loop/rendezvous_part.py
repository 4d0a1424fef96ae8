"""The rendezvous as one part of the agent: one view of this node's round a turn, and its calls.

:class:`RendezvousPart` wraps the spec's handler for the run loop. Each turn it answers with one
frozen :class:`~elastic_run.agent.rules.observation.RoundView`: closed, the round over (a member
lost, nodes waiting, ended elsewhere), nodes waiting that a round has room for, and whether this
node's own heartbeat failed past the peers' budget. Our handler (an ``AgentRendezvous``) keeps
its view current on its own threads, so asking costs no I/O; a handler with torch's calls only is
asked (``is_closed``, ``num_nodes_waiting``) at most once a second, or at once when it reported a
change. The effects on the rendezvous the loop applies go through here too: report a failure,
leave a round with a reason, close, publish state and events for ``status``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from elastic_run.agent.rules.observation import ClosedReason, RoundView
from elastic_run.rendezvous.api import AgentRendezvous, RendezvousHandler, RoundPoll
from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.outage import BACKEND_OUTAGE

__all__ = ["RendezvousPart", "closed_reason"]

log = logging.getLogger(__name__)

_POLL_INTERVAL_S = 1.0


def closed_reason(text: str | None) -> ClosedReason | None:
    """The closed reason of the rules for a backend's text (None: open)."""
    if text is None:
        return None
    if text == "succeeded":
        return "succeeded"
    if text == "failed":
        return "failed"
    return "closed"


class RendezvousPart:
    """This node's view of its rendezvous, for the run loop.

    Args:
        handler: the spec's rendezvous handler.
        wake: wakes the loop (the handler reported a change).
    """

    def __init__(self, handler: RendezvousHandler, wake: Callable[[], None]) -> None:
        self.handler = handler
        self.agent: AgentRendezvous | None = (
            handler if isinstance(handler, AgentRendezvous) else None
        )
        self._wake = wake
        self._changed = threading.Event()
        self._polled_at = float("-inf")
        self._poll = RoundPoll()
        self._joined_at = float("-inf")

    @property
    def endpoint(self) -> str:
        """The backend's endpoint (empty for a handler with torch's calls only)."""
        return self.agent.endpoint if self.agent is not None else ""

    def joining(self, local_world_size: int, role: str) -> None:
        """The loop joins a round: tell our handler who this node is and where to report."""
        if self.agent is not None:
            self.agent.set_local_info(local_world_size, role)
            self.agent.set_change_callback(self._on_change)

    def joined(self) -> None:
        """The round completed: views from here on are of it."""
        self._changed.clear()
        self._polled_at, self._joined_at = float("-inf"), time.monotonic()

    def _on_change(self) -> None:
        self._changed.set()
        self._wake()

    # -- each turn ---------------------------------------------------------------------

    def poll(self) -> RoundPoll:
        """The rendezvous's view: ours keeps it current (no I/O here); a torch-style handler is
        asked at most once a second, or when it reported a change."""
        if self.agent is not None:
            self._poll = self.agent.poll()
            return self._poll
        now = time.monotonic()
        if not self._changed.is_set() and now - self._polled_at < _POLL_INTERVAL_S:
            return self._poll
        self._changed.clear()
        self._polled_at = now
        closed = "closed" if self.handler.is_closed() else None
        self._poll = RoundPoll(closed=closed, nodes_waiting=self.handler.num_nodes_waiting())
        return self._poll

    @property
    def last_poll(self) -> RoundPoll:
        """What :meth:`poll` answered last."""
        return self._poll

    def observe(self, monitor_interval_s: float) -> RoundView:
        """This turn's view of the round, this node's liveness included.

        Args:
            monitor_interval_s: the loop's tick: this node judges itself lost at the last tick
                within the peers' budget (they may judge it gone once the budget passed), a tick
                being at most a quarter of the budget.
        """
        poll = self.poll()
        report = self.agent.liveness() if self.agent is not None else None
        lost = False
        if report is not None:
            # Counted from this round's join at most: the join itself reached the store.
            since = min(report.since_ok_s, time.monotonic() - self._joined_at)
            early = min(monitor_interval_s, report.budget_s / 4)
            lost = since + early >= report.budget_s
        return RoundView(
            closed=closed_reason(poll.closed),
            liveness_lost=lost,
            round_over=poll.round_over,
            member_lost=poll.member_lost,
            end_cause=poll.end_cause,
            nodes_waiting=poll.nodes_waiting,
        )

    # -- effects -----------------------------------------------------------------------

    def report_failure(self, last_restart: bool) -> bool:
        """End the round for this node's failure; True when it counts (torch-style handler:
        always). A lost member is looked for first (its loss, not this failure, then ended the
        round); ``last_restart``: the restarts are used up (the look waits for a verdict even
        in a round too large to ask every member)."""
        if self.agent is None:
            return True
        return self.agent.report_failure(last_restart=last_restart)

    def why_not_counted(self) -> str:
        """Why this node's failure did not spend a restart, in words."""
        lost = self.agent is not None and self.agent.poll().member_lost
        return "a member of the round was lost" if lost else "another node failed first"

    def others_alive(self, fallback: int) -> int:
        """How many other nodes could still form a round (the handler's count), or ``fallback``
        where the handler cannot say (a torch-style handler) or the store failed."""
        if self.agent is None:
            return fallback
        try:
            return self.agent.others_alive()
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, "could not count the nodes left", exc)
            return fallback

    def leave_round(self, reason: str) -> None:
        """Record that this node ends its round, and why (the others tell the same story)."""
        if self.agent is None:
            return
        try:
            self.agent.leave_round(reason)
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, "could not record why this node left the round", exc)

    def round_end_fields(self) -> dict[str, Any]:
        """Who ended this node's round and why (event fields); none when it cannot be read."""
        if self.agent is None:
            return {}
        try:
            end = self.agent.round_end()
        except RendezvousError as exc:
            log.warning("could not read why the round ended: %s", exc)
            return {}
        if end is None:
            return {}
        fields: dict[str, Any] = {"cause": end.cause, "ended_by": end.ended_by}
        if end.lost:
            fields["lost"] = list(end.lost)
        return fields

    def liveness_text(self) -> str:
        """``: no successful heartbeat for 5.2 s (error)`` for a node cut off, or ``""``."""
        if self.agent is None:
            return ""
        report = self.agent.liveness()
        text = f": no successful heartbeat for {report.since_ok_s:.1f} s"
        if report.error:
            text += f" ({report.error})"
        return text

    def closed_now(self) -> ClosedReason:
        """Why the job is closed, read once (after a join found it closed)."""
        if self.agent is None:
            return "closed"
        try:
            return closed_reason(self.agent.closed_reason()) or "closed"
        except RendezvousError:
            return "closed"

    def is_closed_now(self) -> bool:
        """Whether the job is closed, read from the store now (a store that fails: not)."""
        try:
            if self.agent is not None:
                return self.agent.closed_reason() is not None
            return self.handler.is_closed()
        except RendezvousError:
            return False

    def close(self, reason: ClosedReason) -> None:
        """Close the rendezvous (``succeeded``, ``failed`` or ``closed``); a failure is logged."""
        try:
            if self.agent is not None:
                self.agent.set_closed(reason)
            else:
                self.handler.set_closed()
        except RendezvousError as exc:
            log.warning("closing the rendezvous failed: %s", exc)

    def publish_event(self, kind: str, message: str, fields: Mapping[str, Any]) -> None:
        """Publish an event for ``elastic-run status`` (our handler only)."""
        if self.agent is not None:
            self.agent.publish_event(kind, message, dict(fields))

    def publish_state(self, state: str, restarts: int, message: str = "") -> None:
        """Publish this node's state for ``elastic-run status`` (our handler only)."""
        if self.agent is not None:
            self.agent.publish_state(state, restarts, message)
