"""The goodput account: where one node's wall time went, as a fold over its phases and beats.

The run loop folds every phase transition it makes (the events it emits) and every reading of
the workers' progress beats into a :class:`GoodputFold`; :func:`account` closes a copy of the
fold at ``now`` into a :class:`GoodputAccount`: seconds per cause, which add up to the wall
time exactly (every second from :func:`begin` to ``now`` lies in one cause).

Causes:

- ``training``: beats advance (the time between two beats of a normal length);
- ``stall``: no beat for longer than the learned gap: of a gap longer than
  ``max(STALL_FACTOR x typical, typical + STALL_FLOOR_S)`` (typical: the median of the recent
  gaps), what exceeds the typical gap;
- ``startup``: the agent's start to the first beat (rendezvous, worker start, the script's
  imports and first step);
- per restart (a worker failure, or a change of membership: ``restarts``): ``detection`` (from
  the failure to the agent's decision; 0 when this node learned of a loss from the rendezvous),
  ``stop`` (stopping the workers), ``rendezvous`` (the next round), ``worker_start`` (spawning
  the workers) and ``first_beat`` (their start to their first beat);
- ``end``: from the job's end (the last beat before success, or the failure that ended it) to
  the agent's exit (the script's wind-down, the exit barrier, leaving).

Invariants: a transition never moves time backwards (a failure dated before the last accounted
instant counts from that instant: phases do not overlap); beats read late (after the failure)
count for nothing; a restart whose workers never beat ends at the next failure, its
``first_beat`` the time they ran. Pure: no clock, ``now`` is passed in (monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "ACCOUNT_VERSION",
    "RESTART_PHASES",
    "STALL_FACTOR",
    "STALL_FLOOR_S",
    "GoodputAccount",
    "GoodputFold",
    "RestartCost",
    "account",
    "beat",
    "begin",
    "close",
    "finish",
    "from_json",
    "goodput_metrics",
    "membership_changed",
    "merge",
    "on_event",
    "restart_decided",
    "with_bad_nodes",
    "rendezvous_complete",
    "rendezvous_joining",
    "summary_line",
    "worker_failed",
    "workers_started",
]

ACCOUNT_VERSION = 1
STALL_FACTOR = 3.0
STALL_FLOOR_S = 1.0
RESTART_PHASES = ("detection", "stop", "rendezvous", "worker_start", "first_beat")
_GAPS_KEPT = 32
_RESTARTS_KEPT = 64


@dataclass(frozen=True)
class RestartCost:
    """What one restart cost this node, by phase (seconds).

    Attributes:
        cause: ``failure`` (a local worker failed) or ``membership`` (the round changed).
        by: the node whose failure or decision ended the round ("" when not known).
        detection_s, stop_s, rendezvous_s, worker_start_s, first_beat_s: the phases.
    """

    cause: str
    by: str = ""
    detection_s: float = 0.0
    stop_s: float = 0.0
    rendezvous_s: float = 0.0
    worker_start_s: float = 0.0
    first_beat_s: float = 0.0

    @property
    def lost_s(self) -> float:
        """The restart's whole cost."""
        return (
            self.detection_s + self.stop_s + self.rendezvous_s + self.worker_start_s
        ) + self.first_beat_s

    def add(self, phase: str, seconds: float) -> RestartCost:
        """This cost with ``seconds`` more in ``phase`` (one of ``RESTART_PHASES``)."""
        name = f"{phase}_s"
        return replace(self, **{name: getattr(self, name) + seconds})

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this restart (seconds rounded to ms)."""
        body: dict[str, Any] = {"cause": self.cause, "lost_s": _ms(self.lost_s)}
        if self.by:
            body["by"] = self.by
        body.update({f"{p}_s": _ms(getattr(self, f"{p}_s")) for p in RESTART_PHASES})
        return body


@dataclass(frozen=True)
class GoodputFold:
    """The fold's state: time closed so far by cause, the phase now and the beats seen.

    Build it with :func:`begin`; never by hand.
    """

    started_s: float
    since_s: float
    phase: str = "startup"
    closed: tuple[tuple[str, float], ...] = ()
    restarts: tuple[RestartCost, ...] = ()
    restart_count: int = 0
    current: RestartCost | None = None
    pending_detection_s: float = 0.0
    beats: int = 0
    gaps: tuple[float, ...] = ()
    ended: bool = False


@dataclass(frozen=True)
class GoodputAccount:
    """Where a node's (or, merged, a job's) wall time went.

    Attributes:
        wall_s: the wall time accounted (node-seconds once merged).
        training_s, stall_s, startup_s, end_s: seconds per cause.
        restart_s: seconds per restart phase, summed over the restarts (``RESTART_PHASES``).
        restart_count: restarts (failures and membership changes).
        restarts: the last restarts, one cost each (at most 64 kept; empty once merged).
        nodes: how many nodes' accounts this is (1 for a node's own).
        ended: whether the account is final (the agent's run ended).
        bad_node_s: of the restarts' time, what the rounds ended by nodes that were excluded
            as unhealthy cost (:func:`with_bad_nodes`; 0 until known).
    """

    wall_s: float
    training_s: float
    stall_s: float
    startup_s: float
    end_s: float
    restart_s: Mapping[str, float] = field(default_factory=dict)
    restart_count: int = 0
    restarts: tuple[RestartCost, ...] = ()
    nodes: int = 1
    ended: bool = False
    bad_node_s: float = 0.0

    @property
    def lost_s(self) -> float:
        """Every second that was not training."""
        return self.stall_s + self.startup_s + self.end_s + sum(self.restart_s.values())

    @property
    def share(self) -> float:
        """Training as a share of the wall time (0..1; 0 for an empty account)."""
        return self.training_s / self.wall_s if self.wall_s > 0 else 0.0

    def lost_by_cause(self) -> dict[str, float]:
        """Lost seconds by cause: ``startup``, each restart phase (``restart.<phase>``),
        ``stall``, ``end``."""
        out = {"startup": self.startup_s}
        out.update({f"restart.{p}": self.restart_s.get(p, 0.0) for p in RESTART_PHASES})
        out.update(stall=self.stall_s, end=self.end_s)
        return out

    def to_json(self, with_restarts: bool = True) -> dict[str, Any]:
        """The account as JSON (version ``ACCOUNT_VERSION``; seconds rounded to ms).

        Args:
            with_restarts: include each restart's cost (the O(1) published record leaves it
                out; the final ``goodput`` event keeps it).
        """
        body: dict[str, Any] = {
            "v": ACCOUNT_VERSION,
            "wall_s": _ms(self.wall_s),
            "training_s": _ms(self.training_s),
            "share": round(self.share, 4),
            "lost_s": _ms(self.lost_s),
            "lost": {k: _ms(v) for k, v in self.lost_by_cause().items()},
            "restart_count": self.restart_count,
            "nodes": self.nodes,
            "ended": self.ended,
            "bad_node_s": _ms(self.bad_node_s),
        }
        if with_restarts:
            body["restarts"] = [r.to_json() for r in self.restarts]
        return body


def _ms(seconds: float) -> float:
    return round(seconds, 3)


# -- the fold -------------------------------------------------------------------------------


def begin(now_s: float) -> GoodputFold:
    """The fold of an agent that starts at ``now_s`` (in start-up until its workers beat)."""
    return GoodputFold(started_s=now_s, since_s=now_s)


def _add(
    closed: tuple[tuple[str, float], ...], cause: str, seconds: float
) -> tuple[tuple[str, float], ...]:
    if seconds <= 0:
        return closed
    totals = dict(closed)
    totals[cause] = totals.get(cause, 0.0) + seconds
    return tuple(sorted(totals.items()))


def _typical(gaps: tuple[float, ...]) -> float | None:
    if not gaps:
        return None
    ordered = sorted(gaps)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _stall_part(gaps: tuple[float, ...], length_s: float, beats: int) -> float:
    """Of ``length_s`` without a beat (covering ``beats`` beats, at least 1), the stall."""
    typical = _typical(gaps)
    if typical is None:
        return 0.0
    limit = max(STALL_FACTOR * typical, typical + STALL_FLOOR_S)
    if length_s / max(beats, 1) <= limit:
        return 0.0
    return max(0.0, length_s - max(beats, 1) * typical)


def _close(fold: GoodputFold, until_s: float, training_tail: str = "training") -> GoodputFold:
    """Account [since, until) to the phase now; ``training_tail`` names the cause of a training
    phase's open tail (``end`` when the job's end closes it)."""
    until = max(until_s, fold.since_s)
    length = until - fold.since_s
    if length <= 0:
        return fold
    phase = fold.phase
    if phase == "training":
        if training_tail != "training":
            return replace(fold, since_s=until, closed=_add(fold.closed, training_tail, length))
        stall = _stall_part(fold.gaps, length, 1)
        closed = _add(_add(fold.closed, "training", length - stall), "stall", stall)
        return replace(fold, since_s=until, closed=closed)
    if phase == "detection" and fold.current is None:
        return replace(fold, since_s=until, pending_detection_s=fold.pending_detection_s + length)
    if phase in RESTART_PHASES and fold.current is not None:
        return replace(fold, since_s=until, current=fold.current.add(phase, length))
    cause = "startup" if phase in RESTART_PHASES else phase
    return replace(fold, since_s=until, closed=_add(fold.closed, cause, length))


def _end_restart(fold: GoodputFold) -> GoodputFold:
    if fold.current is None:
        return fold
    kept = (*fold.restarts, fold.current)[-_RESTARTS_KEPT:]
    closed = fold.closed
    for p in RESTART_PHASES:
        closed = _add(closed, f"restart.{p}", getattr(fold.current, f"{p}_s"))
    return replace(fold, restarts=kept, current=None, closed=closed)


def _enter(fold: GoodputFold, phase: str, now_s: float) -> GoodputFold:
    if _over(fold):
        return fold
    return replace(_close(fold, now_s), phase=phase)


def beat(fold: GoodputFold, beats: int, last_beat_s: float) -> GoodputFold:
    """A reading of the workers' beats: ``beats`` so far this attempt, the last at
    ``last_beat_s``. A reading with no new beat, or one out of a running attempt, is ignored."""
    if _over(fold) or beats <= fold.beats:
        return fold
    if fold.phase not in ("startup", "first_beat", "training"):
        return replace(fold, beats=beats)  # read after the failure: it counts for nothing
    new = beats - fold.beats
    at = max(last_beat_s, fold.since_s)
    if fold.phase != "training":  # the first beat of the attempt
        fold = _end_restart(_close(fold, at))
        return replace(fold, phase="training", beats=beats)
    length = at - fold.since_s
    stall = _stall_part(fold.gaps, length, new)
    closed = _add(_add(fold.closed, "training", length - stall), "stall", stall)
    gaps = fold.gaps
    if length > 0:
        gaps = (*gaps, length / new)[-_GAPS_KEPT:]
    return replace(fold, since_s=at, closed=closed, beats=beats, gaps=gaps)


def worker_failed(fold: GoodputFold, failed_at_s: float, now_s: float) -> GoodputFold:
    """A local worker failed at ``failed_at_s`` (seen at ``now_s``): detection runs from the
    failure (or the last accounted instant, when later) until the decision."""
    if _over(fold):
        return fold
    at = min(max(failed_at_s, fold.since_s), now_s)
    fold = _end_restart(_close(fold, at))  # a restart whose workers never beat ends here
    return replace(_close(replace(fold, phase="detection"), now_s), phase="detection")


def _stop_begins(fold: GoodputFold, cause: str, now_s: float, by: str = "") -> GoodputFold:
    """A restart for ``cause`` begins (the round ended by node ``by``): the current phase
    closes, stopping starts."""
    if _over(fold):
        return fold
    fold = _end_restart(_close(fold, now_s))
    current = RestartCost(cause, by, detection_s=fold.pending_detection_s)
    return replace(
        fold,
        phase="stop",
        current=current,
        pending_detection_s=0.0,
        restart_count=fold.restart_count + 1,
    )


def restart_decided(fold: GoodputFold, now_s: float, by: str = "") -> GoodputFold:
    """The agent decided to restart its workers after a failure (the round ended by node
    ``by``): stopping starts."""
    return _stop_begins(fold, "failure", now_s, by)


def membership_changed(fold: GoodputFold, now_s: float, by: str = "") -> GoodputFold:
    """The round changed (a lost member, waiting nodes; ended by node ``by``): stopping to
    re-rendezvous starts. This node cannot date the loss: the silence before it counts as a
    stall."""
    return _stop_begins(fold, "membership", now_s, by)


def rendezvous_joining(fold: GoodputFold, now_s: float) -> GoodputFold:
    """The agent joins a round (a restart's ``rendezvous``; start-up before the first beat)."""
    return _enter(fold, "startup" if fold.current is None else "rendezvous", now_s)


def rendezvous_complete(fold: GoodputFold, now_s: float) -> GoodputFold:
    """The round completed: the workers are being started."""
    return _enter(fold, "startup" if fold.current is None else "worker_start", now_s)


def workers_started(fold: GoodputFold, now_s: float) -> GoodputFold:
    """The workers run: waiting for their first beat. Beats count afresh."""
    if _over(fold):
        return fold
    phase = "startup" if fold.current is None else "first_beat"
    return replace(_enter(fold, phase, now_s), beats=0)


def _over(fold: GoodputFold) -> bool:
    return fold.ended or fold.phase == "end"


def finish(fold: GoodputFold, now_s: float) -> GoodputFold:
    """The job ended for this node (succeeded, failed, closed, stopped): the rest, until
    :func:`close`, is ``end``. A failure's detection that led to no restart is ``end`` too."""
    if _over(fold):
        return fold
    fold = _end_restart(_close(fold, now_s, training_tail="end"))
    closed = _add(fold.closed, "end", fold.pending_detection_s)
    return replace(fold, phase="end", closed=closed, pending_detection_s=0.0)


def close(fold: GoodputFold, now_s: float) -> GoodputFold:
    """The agent leaves at ``now_s``: the account is final (later readings change nothing)."""
    if fold.ended:
        return fold
    return replace(_close(finish(fold, now_s), now_s), ended=True)


_ENDS = frozenset({"succeeded", "failed", "closed"})


def on_event(
    fold: GoodputFold,
    kind: str,
    now_s: float,
    fields: Mapping[str, Any] | None = None,
    *,
    failed_at_s: float | None = None,
) -> GoodputFold:
    """Fold one agent event (its kind, at ``now_s``); kinds that move no phase change nothing.

    Args:
        fold: the fold so far.
        kind: the event's kind (``agent/events.py``).
        now_s: when it was emitted (monotonic seconds).
        fields: the event's fields (a ``signal`` that was only forwarded ends nothing).
        failed_at_s: for ``worker.failed``, when the first worker failed (default: now).
    """
    if kind == "worker.failed":
        return worker_failed(fold, now_s if failed_at_s is None else failed_at_s, now_s)
    by = str((fields or {}).get("ended_by") or "")
    if kind == "restart":
        return restart_decided(fold, now_s, by)
    if kind == "membership.changed":
        return membership_changed(fold, now_s, by)
    if kind == "rendezvous.joining":
        return rendezvous_joining(fold, now_s)
    if kind == "rendezvous.complete":
        return rendezvous_complete(fold, now_s)
    if kind == "workers.started":
        return workers_started(fold, now_s)
    if kind in _ENDS or (kind == "signal" and not (fields or {}).get("forwarded")):
        return finish(fold, now_s)
    if kind == "agent.exited":
        return close(fold, now_s)
    return fold


def account(fold: GoodputFold, now_s: float) -> GoodputAccount:
    """The account of ``fold`` closed at ``now_s`` (a final fold's ends where it ended)."""
    open_ = fold if fold.ended else _close(fold, now_s)
    restart_s = {p: 0.0 for p in RESTART_PHASES}
    totals = dict(open_.closed)
    for p in RESTART_PHASES:
        restart_s[p] = totals.get(f"restart.{p}", 0.0)
    restarts = open_.restarts
    if open_.current is not None:
        restarts = (*restarts, open_.current)[-_RESTARTS_KEPT:]
        for p in RESTART_PHASES:
            restart_s[p] += getattr(open_.current, f"{p}_s")
    end_s = totals.get("end", 0.0)
    # A detection not yet decided is shown with the restarts' (it ends in one, or in ``end``).
    restart_s["detection"] += open_.pending_detection_s
    return GoodputAccount(
        wall_s=open_.since_s - fold.started_s,
        training_s=totals.get("training", 0.0),
        stall_s=totals.get("stall", 0.0),
        startup_s=totals.get("startup", 0.0),
        end_s=end_s,
        restart_s=restart_s,
        restart_count=open_.restart_count,
        restarts=restarts,
        ended=fold.ended,
    )


# -- reading and merging published accounts -------------------------------------------------


def _num(body: Mapping[str, Any], key: str) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"goodput field {key!r} is not a number: {value!r}")
    return float(value)


def from_json(body: Mapping[str, Any]) -> GoodputAccount:
    """An account from its JSON (:meth:`GoodputAccount.to_json`).

    Raises:
        ValueError: not an account of version ``ACCOUNT_VERSION``.
    """
    if body.get("v") != ACCOUNT_VERSION:
        raise ValueError(f"not a goodput account of version {ACCOUNT_VERSION}: v={body.get('v')!r}")
    lost = body.get("lost")
    if not isinstance(lost, Mapping):
        raise ValueError("goodput field 'lost' is not an object")
    count = body.get("restart_count")
    nodes = body.get("nodes", 1)
    if not isinstance(count, int) or not isinstance(nodes, int):
        raise ValueError("goodput fields 'restart_count' and 'nodes' must be integers")
    return GoodputAccount(
        wall_s=_num(body, "wall_s"),
        training_s=_num(body, "training_s"),
        stall_s=_num(lost, "stall"),
        startup_s=_num(lost, "startup"),
        end_s=_num(lost, "end"),
        restart_s={p: _num(lost, f"restart.{p}") for p in RESTART_PHASES},
        restart_count=count,
        nodes=nodes,
        ended=bool(body.get("ended", False)),
        bad_node_s=_num(body, "bad_node_s") if "bad_node_s" in body else 0.0,
    )


def merge(accounts: Mapping[str, GoodputAccount]) -> GoodputAccount | None:
    """The job's account from its nodes' (node id -> account): node-seconds summed per cause.

    Each node's wall time is its own agent's (no two clocks are compared); the job's share is
    training node-seconds over wall node-seconds; its restart count is the most any node
    counted (every node of a round restarts together). One node's merge is its account.
    """
    if not accounts:
        return None
    items = list(accounts.values())
    if len(items) == 1:
        return items[0]
    return GoodputAccount(
        wall_s=sum(a.wall_s for a in items),
        training_s=sum(a.training_s for a in items),
        stall_s=sum(a.stall_s for a in items),
        startup_s=sum(a.startup_s for a in items),
        end_s=sum(a.end_s for a in items),
        restart_s={p: sum(a.restart_s.get(p, 0.0) for a in items) for p in RESTART_PHASES},
        restart_count=max(a.restart_count for a in items),
        nodes=sum(a.nodes for a in items),
        ended=all(a.ended for a in items),
        bad_node_s=sum(a.bad_node_s for a in items),
    )


def with_bad_nodes(acc: GoodputAccount, excluded: Iterable[str]) -> GoodputAccount:
    """``acc`` with ``bad_node_s``: the restarts (of those kept) whose round a node of
    ``excluded`` ended: what the bad nodes cost this node.

    Args:
        acc: a node's own account.
        excluded: the ids of the nodes excluded as unhealthy during the job.
    """
    bad = set(excluded)
    return replace(acc, bad_node_s=sum(r.lost_s for r in acc.restarts if r.by and r.by in bad))


def summary_line(acc: GoodputAccount) -> str:
    """One line: the training share of the wall time and the lost time by cause, e.g.
    ``goodput 81.2%: training 40.6 s of 50.0 s; lost 9.4 s (2 restarts; startup 3.1 s, ...)``."""
    unit = "node-s" if acc.nodes > 1 else "s"
    lost = ", ".join(
        f"{name} {seconds:.1f} {unit}"
        for name, seconds in acc.lost_by_cause().items()
        if seconds >= 0.05
    )
    restarts = f"{acc.restart_count} restart{'' if acc.restart_count == 1 else 's'}"
    if acc.bad_node_s >= 0.05:
        restarts += f", {acc.bad_node_s:.1f} {unit} of them to nodes excluded as unhealthy"
    nodes = f" over {acc.nodes} nodes" if acc.nodes > 1 else ""
    return (
        f"goodput {100 * acc.share:.1f}%: training {acc.training_s:.1f} {unit} of "
        f"{acc.wall_s:.1f} {unit}{nodes}; lost {acc.lost_s:.1f} {unit} "
        f"({restarts}{'; ' + lost if lost else ''})"
    )


def goodput_metrics(acc: GoodputAccount | None) -> dict[str, float]:
    """Gauges for ``/metrics`` (names without the ``elastic_run_`` prefix; the lost seconds
    carry a ``cause`` label). None: no gauges."""
    if acc is None:
        return {}
    out = {
        "goodput_ratio": acc.share,
        "goodput_wall_seconds": acc.wall_s,
        "goodput_training_seconds": acc.training_s,
        "goodput_lost_seconds_total": acc.lost_s,
        "goodput_restarts": float(acc.restart_count),
    }
    for cause, seconds in acc.lost_by_cause().items():
        out[f'goodput_lost_seconds{{cause="{cause}"}}'] = seconds
    return out
