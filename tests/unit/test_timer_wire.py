"""The file-timer wire format: one request's encoding and validation, and the stream framer.

The framer is driven by a fake clock (plain floats). Hypothesis checks that any line survives a
round trip, that no input makes decoding raise anything but TimerWireError, and that the
chunking of the pipe's reads never changes what the framer yields.
"""

from __future__ import annotations

import ast
import json
import math
import select
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_run.errors import ElasticRunError
from elastic_run.worker import timer_wire
from elastic_run.worker.timer_wire import (
    MAX_LINE_BYTES,
    FileTimerRequest,
    RequestFramer,
    TimerWireError,
    decode_request,
    encode_request,
)

REQUESTS = st.builds(
    FileTimerRequest,
    worker_pid=st.integers(min_value=1, max_value=2**31 - 1),
    scope_id=st.text(max_size=40),
    expiration_time=st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.just(-1.0)),
    signal=st.sampled_from([0, -1, int(signal.SIGKILL), int(signal.SIGTERM)]),
)


def test_the_line_is_torchs_json_with_a_newline() -> None:
    line = encode_request(FileTimerRequest(123, "step", 1700000000.5, 9))
    assert line == (
        b'{"version": 1, "pid": 123, "scope_id": "step", "expiration_time": 1700000000.5, '
        b'"signal": 9}\n'
    )
    request = FileTimerRequest(123, "s", -1)
    assert (request.signal, request.version, request.worker_id) == (0, 1, 123)
    assert request.is_release


@given(REQUESTS)
def test_any_request_survives_a_round_trip(request: FileTimerRequest) -> None:
    line = encode_request(request)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_request(line[:-1]) == request


def test_a_line_over_pipe_buf_is_refused() -> None:
    overhead = len(encode_request(FileTimerRequest(1, "", 1.5, 9)))
    fits = FileTimerRequest(1, "x" * (select.PIPE_BUF - overhead), 1.5, 9)
    assert len(encode_request(fits)) == select.PIPE_BUF
    with pytest.raises(TimerWireError, match="atomic pipe write"):
        encode_request(FileTimerRequest(1, "x" * (select.PIPE_BUF - overhead + 1), 1.5, 9))
    assert issubclass(TimerWireError, ElasticRunError)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"worker_pid": 0}, "pid must be a positive integer"),
        ({"worker_pid": True}, "pid must be a positive integer"),
        ({"worker_pid": 2**31}, "pid must be a positive integer"),
        ({"worker_pid": "12"}, "pid must be a positive integer"),
        ({"scope_id": 5}, "scope_id must be a string"),
        ({"expiration_time": math.nan}, "finite number"),
        ({"expiration_time": math.inf}, "finite number"),
        ({"expiration_time": "soon"}, "finite number"),
        ({"signal": 999}, "not a valid signal number"),
        ({"signal": 9.0}, "signal must be an integer"),
    ],
)
def test_a_bad_field_is_refused(fields: dict[str, Any], message: str) -> None:
    good: dict[str, Any] = {
        "worker_pid": 12,
        "scope_id": "s",
        "expiration_time": 1.0,
        "signal": 9,
    }
    with pytest.raises(TimerWireError, match=message):
        FileTimerRequest(**{**good, **fields})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"version": 2, "pid": 12, "scope_id": "s", "expiration_time": 0}', "version 2"),
        (b'{"version": true, "pid": 12, "scope_id": "s", "expiration_time": 0}', "version"),
        (b'{"version": 1, "pid": "12", "scope_id": "s", "expiration_time": 0}', "pid"),
        (b'{"version": 1, "scope_id": "s", "expiration_time": 0}', "pid"),
        (b'{"version": 1, "pid": 12, "scope_id": "s", "expiration_time": NaN}', "finite"),
        (b'{"version": 1, "pid": 12, "scope_id": "s", "expiration_time": 1e999}', "finite"),
        (
            b'{"version": 1, "pid": 12, "scope_id": "s", "expiration_time": 1' + b"0" * 400 + b"}",
            "finite",
        ),
        (
            b'{"version": 1, "pid": 12, "scope_id": "s", "expiration_time": 0, "signal": 999}',
            "signal",
        ),
    ],
)
def test_a_bad_line_is_refused_with_the_reason(line: bytes, message: str) -> None:
    with pytest.raises(TimerWireError, match=message):
        decode_request(line)


def test_missing_version_and_signal_read_as_1_and_sigkill() -> None:
    request = decode_request(b'{"pid": 12, "scope_id": "s", "expiration_time": 3}')
    assert request == FileTimerRequest(12, "s", 3.0, int(signal.SIGKILL))
    assert isinstance(request.expiration_time, float)


def _decodes_or_says_why(line: bytes) -> None:
    """``line`` decodes to a request that encodes back to itself, or raises TimerWireError
    with a reason; any other exception escapes and fails the test."""
    try:
        request = decode_request(line)
    except TimerWireError as exc:
        assert str(exc), "a refusal must say why"
    else:
        assert isinstance(request, FileTimerRequest)
        assert decode_request(encode_request(request).rstrip(b"\n")) == request


@given(st.binary(max_size=300))
def test_decoding_raises_nothing_but_timer_wire_error(line: bytes) -> None:
    _decodes_or_says_why(line)


@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["version", "pid", "scope_id", "expiration_time", "signal"]),
            st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
        ),
        max_size=3,
    )
)
def test_decoding_json_of_any_shape_raises_nothing_but_timer_wire_error(
    records: list[dict[str, object]],
) -> None:
    for record in records:
        _decodes_or_says_why(json.dumps(record).encode())


# ----------------------------------------------------------------------------- framer


def _lines(requests: list[FileTimerRequest]) -> bytes:
    return b"".join(encode_request(r) for r in requests)


@given(st.lists(REQUESTS, max_size=6), st.data())
def test_the_chunking_of_reads_does_not_change_the_requests(
    requests: list[FileTimerRequest], data: st.DataObject
) -> None:
    stream = _lines(requests)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(stream)), max_size=8)))
    framer = RequestFramer()
    got: list[FileTimerRequest] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        framed = framer.feed(stream[start:end], now=0.0)
        assert framed.problems == ()
        got.extend(framed.requests)
    assert got == requests
    assert framer.stale_at is None


def test_a_tail_waits_for_its_newline_until_it_is_stale() -> None:
    framer = RequestFramer(stale_after_s=0.5)
    line = encode_request(FileTimerRequest(7, "s", 10.0, 9))
    assert framer.feed(line[:10], now=100.0).requests == ()
    assert framer.stale_at == 100.5
    assert framer.drop_stale(now=100.4) == ()
    assert framer.feed(line[10:], now=100.45).requests == (FileTimerRequest(7, "s", 10.0, 9),)
    assert framer.stale_at is None

    framer.feed(line[:10], now=200.0)
    assert framer.drop_stale(now=200.5) == ("dropping an incomplete request of 10 bytes",)
    assert framer.stale_at is None
    assert framer.feed(line, now=201.0).requests == (FileTimerRequest(7, "s", 10.0, 9),)


def test_a_fragment_followed_by_a_whole_line_yields_the_line() -> None:
    request = FileTimerRequest(7, "salvaged", 0.0, 9)
    framed = RequestFramer().feed(b'{"version": 1, "pid": 4' + encode_request(request), now=0.0)
    assert framed.requests == (request,)
    assert framed.problems == ("dropping 23 bytes of a broken request before a valid one",)


def test_bad_lines_are_reported_and_skipped() -> None:
    good = FileTimerRequest(7, "s", 5.0, 9)
    stream = b"not json\n\n  \n[1]\n" + encode_request(good)
    framed = RequestFramer().feed(stream, now=0.0)
    assert framed.requests == (good,)
    assert [p.split(" (")[0] for p in framed.problems] == ["ignoring a bad request"] * 2


def test_an_oversized_line_is_dropped_whole_and_the_next_one_kept() -> None:
    good = FileTimerRequest(7, "s", 5.0, 9)
    framer = RequestFramer(max_line_bytes=100)
    first = framer.feed(b"x" * 150, now=0.0)
    assert first.problems == ("dropping a request line longer than 100 bytes",)
    second = framer.feed(b"y" * 50 + b"\n" + encode_request(good), now=0.01)
    assert second.requests == (good,)
    assert second.problems == ()
    whole = framer.feed(b"z" * 120 + b"\n" + encode_request(good), now=0.02)
    assert whole.requests == (good,)
    assert whole.problems == ("dropping a request line of 120 bytes (limit 100)",)


def test_a_dead_oversized_writer_does_not_eat_the_next_line() -> None:
    good = FileTimerRequest(7, "s", 5.0, 9)
    framer = RequestFramer(max_line_bytes=100, stale_after_s=0.1)
    framer.feed(b"x" * 150, now=0.0)
    assert framer.drop_stale(now=0.2) == ()
    assert framer.feed(encode_request(good), now=0.3).requests == (good,)


def test_max_line_bytes_defaults_to_pipe_buf() -> None:
    assert MAX_LINE_BYTES == select.PIPE_BUF


def test_the_wire_module_imports_only_the_standard_library_and_errors() -> None:
    tree = ast.parse(Path(timer_wire.__file__).read_text())
    modules = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    ours = {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names}
    assert ours == {"elastic_run.errors"}
