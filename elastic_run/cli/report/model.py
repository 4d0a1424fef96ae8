"""The report's shapes: what is read from the log directories and what the report says.

Times: an :class:`Event`'s ``ts`` is its node's wall clock (epoch seconds); every time in a
:class:`Report` (segments, markers, rounds, verdicts) is on the reference node's clock, each
node's events shifted by its :class:`ClockFit` offset. No two clocks are compared otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_run.agent.loop.goodput import GoodputAccount

__all__ = [
    "ClockFit",
    "Event",
    "Lane",
    "Link",
    "Marker",
    "NodeLog",
    "Problem",
    "Report",
    "Round",
    "Row",
    "Segment",
    "WorkerFiles",
]


@dataclass(frozen=True)
class Event:
    """One line of a node's ``events.jsonl``.

    Attributes:
        ts: when it was emitted, on its node's wall clock (epoch seconds).
        kind: its kind (``agent/events.py``).
        message: its sentence.
        fields: its fields.
        line: its line number in the file (1-based).
    """

    ts: float
    kind: str
    message: str
    fields: Mapping[str, Any]
    line: int


@dataclass(frozen=True)
class Problem:
    """Something wrong with the input, said in one line: ``<where>: <text>``."""

    where: str
    text: str

    def line(self) -> str:
        """The problem as one line."""
        return f"{self.where}: {self.text}"


@dataclass(frozen=True)
class WorkerFiles:
    """What one worker of one attempt left in ``attempt_<n>/<local_rank>/``.

    Attributes:
        attempt: the attempt (``n``).
        local_rank: the worker's local rank.
        names: the files there (``stdout.log``, ``stderr.log``, ``error.json``, ``stacks.txt``).
        error: the first line of its error file's message, when it wrote one.
    """

    attempt: int
    local_rank: int
    names: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class NodeLog:
    """One node's run folder, read: its events, its workers' files, what was wrong.

    Attributes:
        name: the folder, relative to the log directory it was found in (its label).
        path: the folder's absolute path (links are made relative to the page from it).
        events: its events, in file order.
        workers: its workers' files, by attempt and local rank.
        problems: what was wrong with its files.
    """

    name: str
    path: str
    events: tuple[Event, ...]
    workers: tuple[WorkerFiles, ...] = ()
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class Segment:
    """A stretch of a lane's time in one cause (the goodput account's: ``training``,
    ``startup``, ``restart.<phase>``, ``stall``, ``end``; ``running`` where the node left no
    account to tell training from its workers' start).

    Attributes:
        cause: the cause.
        start_s, end_s: its bounds (reference clock, epoch seconds).
        inferred: after the node's last event (its log ends; the peers saw it later).
    """

    cause: str
    start_s: float
    end_s: float
    inferred: bool = False


@dataclass(frozen=True)
class Link:
    """A link to a file a worker left: a label and the file's absolute path."""

    label: str
    path: str


@dataclass(frozen=True)
class Marker:
    """Something that happened on a lane at one instant.

    Attributes:
        style: how it is drawn: ``failure``, ``hang``, ``straggler``, ``lost``, ``excluded``,
            ``suspect``, ``check_failed``, ``link_slow``, ``close``, ``signal``,
            ``membership``, ``restart``, ``log_end`` or ``other`` (an unknown kind).
        kind: the event's kind.
        at_s: when (reference clock).
        lane: the lane it is drawn on (index into ``Report.lanes``).
        text: what happened, one sentence.
        round: the round the lane was in, or -1.
        rank: the rank it names, or None.
        cause: the root cause (an error file's message, the ending's reason), when known.
        links: the worker's files (log, error file, stacks).
        source: the lane whose event this is (a straggler is judged on another node).
        count: how many such markers this one stands for (grouped rows, clusters).
        verdict: whether it belongs in the table of verdicts.
    """

    style: str
    kind: str
    at_s: float
    lane: int
    text: str
    round: int = -1
    rank: int | None = None
    cause: str | None = None
    links: tuple[Link, ...] = ()
    source: int = -1
    count: int = 1
    verdict: bool = True


@dataclass(frozen=True)
class ClockFit:
    """How a node's clock was put on the reference clock.

    Attributes:
        offset_s: added to the node's times.
        residual_s: the largest disagreement left over the shared rounds (0 for the reference).
        shared: how many rounds it was aligned by.
        aligned: False when it shares no round with an aligned node (its own clock is used,
            offset 0: its times are not comparable with the others').
        reference: whether it is the reference node.
    """

    offset_s: float = 0.0
    residual_s: float = 0.0
    shared: int = 0
    aligned: bool = True
    reference: bool = False


@dataclass(frozen=True)
class Lane:
    """One node: its phases, its clock, its account.

    Attributes:
        index: its place in ``Report.lanes``.
        label: ``node <group rank in its first round>`` (made unique).
        name: its folder, relative to the log directory.
        path: its folder's absolute path.
        segments: its phases (reference clock).
        clock: how its clock was aligned.
        account: its final goodput account, as it recorded it (None: it left none).
        ended: how its log ends: ``succeeded``, ``failed``, ``closed``, ``signal``, ``ended``
            (its final account, no other ending), ``lost`` (its peers lost it), or
            ``log ends`` (no ending event).
        rounds: the rounds it completed.
        first_group_rank: its group rank in its first round (-1: it completed none).
        events: how many events it logged.
    """

    index: int
    label: str
    name: str
    path: str
    segments: tuple[Segment, ...]
    clock: ClockFit
    account: GoodputAccount | None
    ended: str
    rounds: tuple[int, ...]
    first_group_rank: int
    events: int


@dataclass(frozen=True)
class Row:
    """One drawn row of the timeline: a lane, or a group of lanes alike.

    Attributes:
        label: what the row is called.
        lanes: the lanes it stands for.
        segments: what it draws (a group's: the median bounds of its lanes').
        markers: what it marks (a group's: its lanes', clustered).
        note: a line that says what a group is (empty for a lane).
    """

    label: str
    lanes: tuple[int, ...]
    segments: tuple[Segment, ...]
    markers: tuple[Marker, ...]
    note: str = ""

    @property
    def is_group(self) -> bool:
        """Whether the row stands for more than one lane."""
        return len(self.lanes) > 1


@dataclass(frozen=True)
class Round:
    """A round of the rendezvous as the nodes completed it.

    Attributes:
        number: the round's number.
        at_s: when it completed (the median of its nodes', reference clock).
        lanes: the nodes that completed it.
        world_size: its world size (workers).
        restart_count: the job's restart count in it.
        ended: how it ended, one sentence.
    """

    number: int
    at_s: float
    lanes: tuple[int, ...]
    world_size: int
    restart_count: int
    ended: str


@dataclass(frozen=True)
class Report:
    """Everything the page, the summary and ``--json`` show.

    Attributes:
        run_id: the job's run id.
        lanes: one per node, in the order drawn (group rank of the first round, then folder).
        rows: the rows drawn (lanes, or groups of lanes at scale).
        markers: every marker.
        rounds: the rounds, in order.
        goodput: the job's account (the nodes' merged), or None when no node left one.
        restart_count: the job's restart count (restarts spent on failures).
        start_s, end_s: the span drawn (reference clock).
        reference: the lane whose clock is the reference, or -1.
        outcome: how the job ended, one sentence.
        root_cause: the first failure's marker, or None.
        problems: what was wrong with the input.
        other_runs: other run ids found beside this one (with their node counts).
    """

    run_id: str
    lanes: tuple[Lane, ...]
    rows: tuple[Row, ...]
    markers: tuple[Marker, ...]
    rounds: tuple[Round, ...]
    goodput: GoodputAccount | None
    restart_count: int
    start_s: float
    end_s: float
    reference: int
    outcome: str
    root_cause: Marker | None
    problems: tuple[Problem, ...] = ()
    other_runs: tuple[tuple[str, int], ...] = field(default=())

    @property
    def span_s(self) -> float:
        """The drawn span's length (at least a millisecond)."""
        return max(self.end_s - self.start_s, 1e-3)

    def verdicts(self) -> tuple[Marker, ...]:
        """The markers that are verdicts, in time order."""
        return tuple(sorted((m for m in self.markers if m.verdict), key=lambda m: m.at_s))
