"""Slurm's hostlist grammar: expand ``n[01-04,07],login`` into host names.

One concept: the compact host list notation Slurm uses in ``SLURM_JOB_NODELIST`` and in
``scontrol`` output, expanded in Python (no ``scontrol show hostnames`` needed).

Grammar: a comma list of names at the top level; a name holds literal text and bracket groups;
a group holds a comma list of ``N`` or ``LO-HI`` (ASCII digits). A range keeps the width of its
lower bound (``[08-10]`` is 08, 09, 10); several groups in one name multiply out in order
(``r[1-2]n[1-2]`` is r1n1, r1n2, r2n1, r2n2).

Invariants: pure functions of their argument; a malformed expression raises
:class:`ConfigurationError` naming the expression and the fault, never another exception.
Nothing is expanded that is not asked for: :func:`first_host` reads the first name of each
group only, and :func:`expand_hostlist` counts the names before it lists them and refuses more
than :data:`MAX_HOSTS` (``n[1-99999999999]`` is an error, not an exhausted memory).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from elastic_run.errors import ConfigurationError

__all__ = ["MAX_HOSTS", "expand_hostlist", "first_host"]

MAX_HOSTS = 1_000_000
"""The most names :func:`expand_hostlist` lists (the launcher's bound on a job's nodes)."""

_RANGE_RE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")


@dataclass(frozen=True)
class _Range:
    """``LO-HI`` in a bracket group (``N`` is ``N-N``), printed ``width`` digits wide."""

    low: int
    high: int
    width: int

    def __len__(self) -> int:
        return self.high - self.low + 1

    def numbers(self) -> Iterator[str]:
        return (str(value).zfill(self.width) for value in range(self.low, self.high + 1))


# A name is a sequence of pieces: literal text, or a bracket group (a tuple of ranges).
_Piece = str | tuple[_Range, ...]


def _split_top_level(spec: str) -> list[str]:
    """Split ``spec`` at the commas outside brackets; check that brackets balance."""
    parts: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(spec):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ConfigurationError(f"hostlist {spec!r}: nested '[' at position {index}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ConfigurationError(f"hostlist {spec!r}: ']' without '[' at position {index}")
        elif char == "," and depth == 0:
            parts.append(spec[start:index])
            start = index + 1
    if depth != 0:
        raise ConfigurationError(f"hostlist {spec!r}: '[' without a closing ']'")
    parts.append(spec[start:])
    return parts


def _parse_group(body: str, spec: str) -> tuple[_Range, ...]:
    """Parse the inside of one bracket group (``01-04,07``) into its ranges."""
    ranges: list[_Range] = []
    for item in body.split(","):
        match = _RANGE_RE.match(item)
        if match is None:
            raise ConfigurationError(
                f"hostlist {spec!r}: bad range {item!r} in [{body}] "
                "(expected N or LO-HI, digits only)"
            )
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            raise ConfigurationError(f"hostlist {spec!r}: reversed range {item!r} ({low} > {high})")
        # Slurm keeps the width of the lower bound: [08-10] is 08, 09, 10.
        ranges.append(_Range(low, high, len(low_text)))
    return tuple(ranges)


def _parse_name(name: str, spec: str) -> list[_Piece]:
    """Parse one top-level item, which may hold several bracket groups."""
    if not name:
        raise ConfigurationError(f"hostlist {spec!r}: empty host name")
    pieces: list[_Piece] = []
    position = 0
    while position < len(name):
        open_at = name.find("[", position)
        if open_at < 0:
            pieces.append(name[position:])
            break
        close_at = name.index("]", open_at)  # balanced: checked by _split_top_level
        if open_at > position:
            pieces.append(name[position:open_at])
        group = name[open_at + 1 : close_at]
        if not group:
            raise ConfigurationError(f"hostlist {spec!r}: empty brackets in {name!r}")
        pieces.append(_parse_group(group, spec))
        position = close_at + 1
    return pieces


def _parse(spec: str) -> list[list[_Piece]]:
    stripped = spec.strip()
    if not stripped:
        raise ConfigurationError(f"hostlist {spec!r} is empty")
    return [_parse_name(name.strip(), spec) for name in _split_top_level(stripped)]


def _count(pieces: list[_Piece]) -> int:
    return math.prod(sum(len(r) for r in piece) for piece in pieces if not isinstance(piece, str))


def _names(pieces: list[_Piece]) -> Iterator[str]:
    """Every name of one item, in order (product() holds each group's numbers: count first)."""
    choices = [
        (piece,) if isinstance(piece, str) else tuple(n for r in piece for n in r.numbers())
        for piece in pieces
    ]
    return ("".join(parts) for parts in itertools.product(*choices))


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in order.

    Supports ranges and lists in brackets (``n[01-04,07]``), several bracket groups in one
    name (``r[1-2]n[1-2]`` is r1n1, r1n2, r2n1, r2n2), comma lists at the top level
    (``a,b[1-2],c``), zero padding (the width of a range's lower bound) and dotted names
    such as ``127.0.0.[1-2]``.

    Args:
        spec: the expression, e.g. the value of ``SLURM_JOB_NODELIST``.

    Returns:
        The host names, duplicates kept, in the order the expression names them.

    Raises:
        ConfigurationError: the expression is empty, its brackets do not balance or nest,
            a range is reversed or holds something other than digits, or it names more than
            :data:`MAX_HOSTS` hosts.
    """
    names = _parse(spec)
    total = sum(_count(pieces) for pieces in names)
    if total > MAX_HOSTS:
        raise ConfigurationError(
            f"hostlist {spec[:60]!r}: names {total} hosts, more than {MAX_HOSTS} (a typo?)"
        )
    return [host for pieces in names for host in _names(pieces)]


def first_host(spec: str) -> str:
    """Return the first host of a Slurm hostlist expression, expanding nothing else.

    Args:
        spec: a hostlist expression (``127.0.0.[1-2]``).

    Returns:
        The first host name (``127.0.0.1``).

    Raises:
        ConfigurationError: the expression is malformed (see :func:`expand_hostlist`; its
            size is not checked here).
    """
    pieces = _parse(spec)[0]
    return "".join(p if isinstance(p, str) else next(p[0].numbers()) for p in pieces)
