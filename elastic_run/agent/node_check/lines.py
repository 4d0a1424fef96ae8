"""The node check's words: the agent's start-up line, its failure line, and the pieces in them.

One concept: how a node check reads to a person. The agent prints exactly one of

    node check passed in 1.2 s: devices: no accelerator requested, nothing checked; disk: 120 GiB free; command: ok
    node h3 failed its node check: scratch disk full

(:func:`startup_line`, :func:`failure_line`); the checks build their details with
:func:`show_bytes`, :func:`show_seconds` and :func:`one_line`, so every figure reads the same.

Pure: text in, text out.
"""

from __future__ import annotations

from elastic_run.agent.node_check.result import NodeCheckResult

__all__ = [
    "MAX_LINE_CHARS",
    "failure_line",
    "one_line",
    "show_bytes",
    "show_seconds",
    "startup_line",
]

MAX_LINE_CHARS = 200
"""The longest detail a check keeps of text it did not write (a command's first line)."""

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def show_bytes(count: int) -> str:
    """A size for a person: ``512 B``, ``3.2 GiB``, ``120 GiB`` (powers of 1024).

    Args:
        count: bytes (0 or more).

    Returns:
        Two or three significant figures and a binary unit.
    """
    value = float(max(0, count))
    unit = 0
    while value >= 1024 and unit < len(_BINARY_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value)} B"
    shown = f"{value:.1f}" if value < 10 else f"{value:.0f}"
    return f"{shown.removesuffix('.0')} {_BINARY_UNITS[unit]}"


def show_seconds(seconds: float) -> str:
    """A duration for a person: ``30 s``, ``2.5 s``, ``0.25 s``, ``0.004 s``.

    Args:
        seconds: the duration.

    Returns:
        One decimal from 1 s, two from 0.1 s, three below, without trailing zeros, and `` s``.
    """
    places = 1 if seconds >= 1 else 2 if seconds >= 0.1 else 3
    text = f"{seconds:.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} s"


def one_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """Make text that another program wrote fit one line of ours.

    Args:
        text: the text (one line of a command's output, an error's message).
        limit: the most characters kept; a longer text ends in ``...``.

    Returns:
        ``text`` stripped, each control character (a tab, an escape sequence's ESC) shown as
        ``?``, cut to ``limit``.
    """
    clean = "".join(c if c.isprintable() else "?" for c in text.strip())
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


def startup_line(result: NodeCheckResult) -> str:
    """The line the agent prints when its node passed the check (or did not run it).

    Args:
        result: the check's result.

    Returns:
        ``node check passed in 1.2 s: devices: ...; disk: ...; command: ...``, or
        ``node check off (--no-node-check)``; for an unhealthy node, :func:`failure_line`'s
        words without the node's name (``node check failed in 0.3 s: ...``).
    """
    if not result.enabled:
        return "node check off (--no-node-check)"
    took = show_seconds(result.duration_s)
    if not result.healthy:
        return f"node check failed in {took}: {result.reason}"
    checks = "; ".join(f"{c.name}: {c.detail}" for c in result.checks)
    return f"node check passed in {took}: {checks}" if checks else f"node check passed in {took}"


def failure_line(node: str, result: NodeCheckResult) -> str:
    """The line the agent prints when its node failed the check, before it exits 6.

    Args:
        node: the node's name as the job shows it (its host name).
        result: the check's result (unhealthy).

    Returns:
        ``node h3 failed its node check: <reason>``.
    """
    return f"node {node} failed its node check: {result.reason or 'no reason given'}"
