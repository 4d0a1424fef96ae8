"""This node's fault history as one part of the agent: charged, published, and read beside the job's.

:class:`NodeLedger` keeps the failures charged to this node (``agent/rules/nodes/history.py``):
its own record is the truth for its own verdicts, and is published (``fh/<node id>``, one O(1)
write per failure) for ``status`` and for the other nodes. When this node's workers fail, the
loop asks it for the other members' records (one batch read), so the node verdict can tell a
bad node from a rank-dependent bug (a failure that followed its rank to another node). A record
that is not ours (garbage, a forged count, another node's id under this key) is left out with
one warning: it never decides, and never raises.

Threads: everything runs on the agent's loop, at a failure or an ending (store reads there are
the loop's, as the failure report's own are).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from elastic_run.agent.rules.nodes.history import Fault, FaultHistory, from_json
from elastic_run.agent.rules.observation import NodeView
from elastic_run.rendezvous.api import AgentRendezvous
from elastic_run.rendezvous.dynamic.telemetry import TelemetryHost
from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.outage import BACKEND_OUTAGE

__all__ = ["NodeLedger"]

log = logging.getLogger(__name__)


class NodeLedger:
    """The failures charged to this node, and what it read of the others'.

    Args:
        rendezvous: our handler (None: a torch-style one; nothing is kept or published).
        host: this node's host name.
        max_failures: ``--max-node-failures``.
    """

    def __init__(self, rendezvous: AgentRendezvous | None, host: str, max_failures: int) -> None:
        self._rdzv = rendezvous
        self.host = host
        self.max_failures = max_failures
        node_id = str(getattr(rendezvous, "node_id", "")) if rendezvous is not None else ""
        self._own = FaultHistory(node_id, host) if rendezvous is not None else None
        self._others: dict[str, FaultHistory] = {}
        self._warned: set[str] = set()
        self._excluded_ids: frozenset[str] = frozenset()

    @property
    def own(self) -> FaultHistory | None:
        """This node's history (None: not kept)."""
        return self._own

    def view(self) -> NodeView:
        """The rules' record of this node among the job's."""
        return NodeView(self._own, tuple(self._others.values()), self.max_failures)

    def charge(self, fault: Fault) -> FaultHistory | None:
        """Charge ``fault`` to this node and publish its history; return it."""
        if self._own is None:
            return None
        self._own = self._own.charged(fault)
        self._publish()
        return self._own

    def exclude(self, reason: str) -> None:
        """Record (and publish) that this node is excluded for ``reason``; list it in the
        job's excluded nodes (for the others' summaries)."""
        if self._own is not None:
            self._own = self._own.excluded_for(reason)
            self._publish()
            rdzv = self._rdzv
            if isinstance(rdzv, TelemetryHost):
                rdzv.telemetry().note_excluded(reason)

    def _publish(self) -> None:
        rdzv = self._rdzv
        if self._own is not None and isinstance(rdzv, TelemetryHost):
            rdzv.telemetry().publish_faults(self._own.to_json(self.max_failures))

    def read_others(self) -> NodeView:
        """Read the current round's other members' histories (one batch); return the view.

        A store that fails leaves the histories as last read (logged once per failure).
        """
        rdzv = self._rdzv
        if rdzv is None or self._own is None or not isinstance(rdzv, TelemetryHost):
            return self.view()
        try:
            snapshot = rdzv.snapshot()
            ids = [m.node_id for m in snapshot.members] if snapshot is not None else []
            self._read([i for i in ids if i != self._own.node_id], rdzv)
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, "could not read the other nodes' fault histories", exc)
        return self.view()

    def excluded_nodes(self) -> tuple[str, ...]:
        """The other nodes excluded during the job, one line each (``h3: root cause of 2 failed
        rounds ...``): one read of the job's list (shown, never decided by)."""
        rdzv = self._rdzv
        if rdzv is None or self._own is None or not isinstance(rdzv, TelemetryHost):
            return ()
        try:
            listed = rdzv.telemetry().read_excluded()
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, "could not read the job's excluded nodes", exc)
            return ()
        self._excluded_ids = frozenset(e["node"] for e in listed)
        return tuple(
            f"{e['host'] or e['node']}: {e['reason']}"
            for e in listed
            if e["node"] != self._own.node_id
        )

    def excluded_ids(self) -> frozenset[str]:
        """The ids of the nodes excluded during the job as :meth:`excluded_nodes` read them,
        this node's own when it was excluded."""
        own = self._own
        mine = {own.node_id} if own is not None and own.excluded is not None else set()
        return self._excluded_ids | mine

    def _read(self, node_ids: Iterable[str], host: TelemetryHost) -> None:
        ids = list(node_ids)
        if not ids:
            return
        records, problems = host.telemetry().read_faults(ids)
        for problem in problems:
            self._warn_once(problem, problem)
        for node_id, record in records.items():
            try:
                self._others[node_id] = from_json(node_id, record.get("history"))
            except ValueError as exc:
                self._others.pop(node_id, None)
                self._warn_once(node_id, f"the fault history of node {node_id} is ignored: {exc}")

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", text)
