"""The round notice, pure: its line, what a parse refuses, and which notices are worth a look.

``protocol/round_notice.py``: a member that ends a round sends one line to the others; the
receiver parses it and looks at the store only for a notice about its current round that is
news, from a member, a node at the round's door, or (about a close) anyone. Everything else
(garbage, another job, an older or later round, an index the seal left out, a known end) is
dropped without a read.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_run.rendezvous.errors import RendezvousStateError
from elastic_run.rendezvous.protocol.records import SealRecord
from elastic_run.rendezvous.protocol.round_notice import (
    MAX_LINE,
    PREFIX,
    RoundNotice,
    encode_notice,
    parse_notice,
    skip_reason,
)

NOTICE = RoundNotice("job", 4, "host-12-ab", 2, "worker_failure")
# Round 4 admitted arrivals 0..2 and 5 (3 and 4 came late and wait at the door).
SEAL = SealRecord(4, 6, ((0, 2), (5, 5)), 4, "max", ((4, 1, "default"),))


def _line(**body: object) -> bytes:
    return PREFIX + json.dumps(body).encode() + b"\n"


def test_a_notice_survives_its_line() -> None:
    line = encode_notice(NOTICE)
    assert line.startswith(PREFIX) and line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_notice(line) == NOTICE
    assert parse_notice(line.rstrip(b"\n")) == NOTICE  # as the listener hands it over


@given(
    job=st.text(max_size=64),
    r=st.integers(0, 2**40),
    by=st.text(max_size=64),
    index=st.integers(-1, 2**20),
    cause=st.text(max_size=32),
)
def test_any_notice_survives_its_line(job: str, r: int, by: str, index: int, cause: str) -> None:
    notice = RoundNotice(job, r, by, index, cause)
    assert parse_notice(encode_notice(notice)) == notice


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"\x00\xff\xfe garbage",
        b"GET / HTTP/1.1",
        b"elastic-run alive host-1-ab",  # a greeting sent back
        PREFIX + b"{not json",
        PREFIX + b"\xff\xfe",
        PREFIX + b"[1, 2]",
        _line(v=2, job="job", round=1, by="x", index=0, cause=""),  # a version we do not know
        _line(job="job", round=1, by="x", index=0, cause=""),  # no version
        _line(v=1, job="job", round=1, by="x", index=0),  # a field missing
        _line(v=1, job="job", round=1, by="x", index=0, cause="", cmd="rm -rf /"),  # one extra
        _line(v=1, job="job", round="1", by="x", index=0, cause=""),  # a str for an int
        _line(v=1, job="job", round=True, by="x", index=0, cause=""),  # a bool for an int
        _line(v=1, job="job", round=1.5, by="x", index=0, cause=""),
        _line(v=1, job=None, round=1, by="x", index=0, cause=""),
        _line(v=1, job="job", round=-1, by="x", index=0, cause=""),
        _line(v=1, job="job", round=1, by="x", index=-2, cause=""),
        _line(v=1, job="job", round=1, by="x" * 300, index=0, cause=""),  # a text too long
        PREFIX + b"x" * MAX_LINE,  # a line too long
    ],
)
def test_a_line_that_is_not_a_notice_is_refused_with_one_error(line: bytes) -> None:
    with pytest.raises(RendezvousStateError, match="not a round notice"):
        parse_notice(line)


@given(st.binary(max_size=2 * MAX_LINE))
def test_no_bytes_crash_the_parse(line: bytes) -> None:
    try:
        notice = parse_notice(line)
    except RendezvousStateError as exc:
        assert "not a round notice" in str(exc)
    else:
        assert isinstance(notice, RoundNotice)


def test_an_encoded_line_too_long_is_refused_at_the_sender() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        encode_notice(RoundNotice("j" * 900, 1, "x" * 200))


def test_a_members_notice_about_the_current_round_asks_for_a_look() -> None:
    assert skip_reason(NOTICE, "job", "me", 4, SEAL, known_over=False) is None
    late = RoundNotice("job", 4, "other", 5, "rejoin")  # admitted from beyond the first range
    assert skip_reason(late, "job", "me", 4, SEAL, known_over=False) is None
    # Without the seal the index cannot be checked: the store decides.
    assert skip_reason(NOTICE, "job", "me", 4, None, known_over=False) is None


@pytest.mark.parametrize(
    "notice",
    [
        RoundNotice("job", 4, "door-1-ab", 6, "nodes_waiting"),  # arrived after the seal
        RoundNotice("job", 4, "door-1-ab", 99, "member_lost"),  # judged a member lost there
        RoundNotice("job", 4, "elastic-run close@h pid 7", -1, "closed"),  # never arrived
    ],
)
def test_a_door_nodes_or_a_closers_notice_asks_for_a_look(notice: RoundNotice) -> None:
    # Not a member's: the store says whether nodes wait, a member was lost, the job closed.
    assert skip_reason(notice, "job", "me", 4, SEAL, known_over=False) is None
    assert skip_reason(notice, "job", "me", 4, SEAL, known_over=True) == "known"


@pytest.mark.parametrize(
    ("notice", "node_id", "current", "known", "why"),
    [
        (RoundNotice("other", 4, "x", 0), "me", 4, False, "other job"),
        (RoundNotice("job", 4, "me", 0), "me", 4, False, "own"),
        (RoundNotice("job", 4, "x", 0), "me", None, False, "no round"),
        (RoundNotice("job", 3, "x", 0), "me", 4, False, "older round"),  # a replay
        (RoundNotice("job", 0, "x", 0), "me", 4, False, "older round"),
        (RoundNotice("job", 5, "x", 0), "me", 4, False, "later round"),
        (RoundNotice("job", 4, "x", 3), "me", 4, False, "not a member"),  # left out by the seal
        (RoundNotice("job", 4, "x", 4), "me", 4, False, "not a member"),
        (RoundNotice("job", 4, "x", -1), "me", 4, False, "not a member"),  # never arrived
        (RoundNotice("job", 4, "x", -1, "worker_failure"), "me", 4, False, "not a member"),
        (RoundNotice("job", 4, "x", 1), "me", 4, True, "known"),
    ],
)
def test_a_notice_that_is_no_news_costs_no_read(
    notice: RoundNotice, node_id: str, current: int | None, known: bool, why: str
) -> None:
    assert skip_reason(notice, "job", node_id, current, SEAL, known_over=known) == why
