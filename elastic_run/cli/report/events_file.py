"""Parsing one node's ``events.jsonl``: its good lines as :class:`Event` s, its bad ones as
problems, one line per kind of problem (with the line numbers it covers). Pure.

A line is good when it is a JSON object of version 1 (``agent/events.py``) with a finite
``ts`` in a plausible range, a string ``kind`` and an object ``fields``. A non-finite or huge
number anywhere in the line makes it bad. A last line without its newline that is not JSON
is a truncated write (the agent was killed while writing it).
"""

from __future__ import annotations

import json
import math
from typing import Any

from elastic_run.cli.report.model import Event, Problem

__all__ = ["EVENT_VERSION", "MAX_TS_S", "parse_events"]

EVENT_VERSION = 1
MAX_TS_S = 1e11  # the year 5138: a later timestamp is garbage
_MAX_NUMBER = 1e15
_SHOWN_LINES = 5


class _BadNumber(ValueError):
    pass


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or abs(value) > _MAX_NUMBER:
        raise _BadNumber(text)
    return value


def _constant(text: str) -> Any:
    raise _BadNumber(text)


_DECODER = json.JSONDecoder(parse_float=_number, parse_constant=_constant)


def _load(line: str) -> Any:
    return _DECODER.decode(line)


def _huge(value: Any) -> bool:
    """Whether an int among ``value`` (a field's value, and the items of a list or object in
    it) is too large; floats were checked as they were parsed."""
    if isinstance(value, int):
        return abs(value) > _MAX_NUMBER
    if isinstance(value, list):
        return any(isinstance(v, int) and abs(v) > _MAX_NUMBER for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, int) and abs(v) > _MAX_NUMBER for v in value.values())
    return False


def _lines_text(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:_SHOWN_LINES])
    more = len(numbers) - _SHOWN_LINES
    word = "line" if len(numbers) == 1 else "lines"
    return f"{word} {shown}" + (f" (and {more} more)" if more > 0 else "")


def parse_events(text: str, where: str) -> tuple[tuple[Event, ...], tuple[Problem, ...]]:
    """The events of one ``events.jsonl`` and what was wrong with it.

    Args:
        text: the file's text.
        where: the file, as problems name it.

    Returns:
        ``(events, problems)``: the good lines in file order; one problem per kind of bad
        line (``not JSON``, ``a number that is not finite or too large``, ``event version``,
        ``not an event``), and one for a truncated last line or a file without events.
    """
    events: list[Event] = []
    bad: dict[str, list[int]] = {}
    truncated = False
    lines = text.split("\n")
    last = len(lines)
    if lines and lines[-1] == "":
        lines.pop()
        last = -1  # every line ends with its newline
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = _load(line)
        except _BadNumber:
            bad.setdefault("a number that is not finite or too large", []).append(number)
            continue
        except ValueError:
            if number == last:
                truncated = True
            else:
                bad.setdefault("not JSON", []).append(number)
            continue
        event, why = _event(body, number)
        if event is None:
            bad.setdefault(why, []).append(number)
        else:
            events.append(event)
    problems = [
        Problem(where, f"{_lines_text(numbers)}: {why}: skipped") for why, numbers in bad.items()
    ]
    if truncated:
        problems.append(Problem(where, f"line {last}: truncated (the write was cut): skipped"))
    if not events:
        problems.append(Problem(where, "no events"))
    return tuple(events), tuple(problems)


def _event(body: Any, number: int) -> tuple[Event | None, str]:
    if not isinstance(body, dict):
        return None, "not an event (not a JSON object)"
    version = body.get("v")
    if version != EVENT_VERSION:
        return None, f"event version {version!r} (this report reads version {EVENT_VERSION})"
    ts, kind, fields = body.get("ts"), body.get("kind"), body.get("fields", {})
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 < ts < MAX_TS_S:
        return None, "not an event (no plausible ts)"
    if not isinstance(kind, str) or not kind:
        return None, "not an event (no kind)"
    if not isinstance(fields, dict):
        return None, "not an event (fields is not an object)"
    if any(_huge(v) for v in fields.values()):
        return None, "a number that is not finite or too large"
    message = body.get("message")
    return Event(float(ts), kind, message if isinstance(message, str) else "", fields, number), ""
