"""A job's rendezvous from outside it: what ``elastic-run status`` and ``close`` read and write.

A reader is not a member: it never joins a round, hosts a c10d store or starts an embedded etcd
member, and it writes nothing but the ``closed`` record of :meth:`JobRendezvous.close` (the one
an agent writes when its job ends), which it then tells the current round's members over their
death-notice ports (``dynamic/round_tell.py``) so that they stop at once. Every call goes through the backend seam
(``rendezvous.backend``); what the records mean is the dynamic handler's (its status reader,
its telemetry, its close), so a reader and the agents never disagree about a key.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from elastic_run.rendezvous.api import RendezvousParameters, RendezvousSnapshot
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.dynamic.handler import CloseOutcome, close_job
from elastic_run.rendezvous.dynamic.round_tell import current_seal, tell_round
from elastic_run.rendezvous.dynamic.status_reader import read_snapshot
from elastic_run.rendezvous.dynamic.telemetry import read_goodput, read_progress
from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.liveness.notice_send import send_line
from elastic_run.rendezvous.protocol.round_notice import RoundNotice
from elastic_run.rendezvous.registry import create_backend

__all__ = ["CloseOutcome", "JobRendezvous", "open_job"]

log = logging.getLogger(__name__)

_TELL_WITHIN_S = 2.0  # the close's notices to the members (a port that does not answer: missed)


def open_job(params: RendezvousParameters) -> JobRendezvous:
    """Open the rendezvous of job ``params.run_id`` as a reader (its backend, never hosted).

    Raises:
        ConfigurationError: the backend has no store to read (static) or is unknown.
        RendezvousConnectionError: the backend cannot be reached.
    """
    return JobRendezvous(create_backend(params, allow_hosting=False), params.run_id)


class JobRendezvous:
    """One job's rendezvous, read (and closed) from outside it.

    Args:
        backend: the job's backend, opened as a reader.
        run_id: the job's id.
    """

    def __init__(self, backend: RendezvousBackend, run_id: str) -> None:
        self._backend = backend
        self.run_id = run_id

    def exists(self) -> bool:
        """Whether any key of the job exists (a job exists while one does)."""
        return self._backend.exists()

    def member_states(self) -> Mapping[str, str] | None:
        """The backend's own members and their states (embedded etcd), or None."""
        return self._backend.member_states()

    def snapshot(self, min_nodes: int = 0, max_nodes: int = 0) -> RendezvousSnapshot | None:
        """The job's picture (round, members, waiting nodes, events), or None: no such job.

        Args:
            min_nodes: the job's minimum when the reader knows it (0: from the records).
            max_nodes: the job's maximum when the reader knows it (0: from the records).
        """
        return read_snapshot(self._backend, self.run_id, min_nodes, max_nodes)

    def heartbeats(self, node_ids: Sequence[str]) -> list[int | None]:
        """The nodes' heartbeat counters now (None: none), in ``node_ids``' order."""
        return self._backend.read_heartbeats(node_ids)

    def progress(
        self, node_ids: Sequence[str]
    ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None, tuple[str, ...]]:
        """The nodes' published progress, the job's summary, and what could not be read."""
        return read_progress(self._backend, node_ids)

    def goodput(self, node_ids: Sequence[str]) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
        """The nodes' published goodput accounts, and what could not be read."""
        return read_goodput(self._backend, node_ids)

    def close(self, closed_by: str, tell_within_s: float = _TELL_WITHIN_S) -> CloseOutcome:
        """Close the job (reason ``closed``): every agent stops its workers and exits 3.

        The current round's members are told at once over their death-notice ports (each
        confirms the close in the store before it stops anything); one not told within
        ``tell_within_s`` sees the close at its next look, as it would without the notice.

        Args:
            closed_by: who closes it (``elastic-run close@host pid N``).
            tell_within_s: how long the notices may take in all.
        """
        outcome = close_job(self._backend, "closed", closed_by)
        if outcome.wrote:
            return dataclasses.replace(outcome, told=self._tell_closed(closed_by, tell_within_s))
        return outcome

    def _tell_closed(self, closed_by: str, within_s: float) -> int:
        """Tell the current round's members that the job closed; return how many got it."""
        try:
            current = current_seal(self._backend)
        except RendezvousError as exc:
            log.info("rendezvous '%s': closed; could not tell its members: %s", self.run_id, exc)
            return 0
        if current is None:
            return 0  # no round runs: a joiner reads the close itself
        r, seal = current
        done = threading.Event()
        told = [0]

        def finished(sent: int, missed: list[str]) -> None:
            told[0] = sent
            done.set()

        notice = RoundNotice(self.run_id, r, closed_by[:200], -1, "closed")
        if tell_round(self._backend, notice, seal, send_line, finished):
            done.wait(within_s)
        return told[0]

    def release(self) -> None:
        """Close this reader's connection to the backend."""
        self._backend.close()
