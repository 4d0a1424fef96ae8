"""How a worker's console lines look and which of them are duplicated: torchrun's rules.

One concept: the per-worker console settings that torchrun derives from its flags.

- A teed stream's console lines start with ``[<role><local rank>]:`` (torchrun's ``TailLog``
  header, no space after the colon), or, when ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` is set,
  with that template filled in (``${role_name}``, ``${rank}``, ``${local_rank}``; unknown
  placeholders stay as written). A stream that is not teed is never prefixed.
- ``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``: lines of a teed stream that
  contain one of the strings also go to ``attempt_<n>/filtered_stdout.log`` /
  ``filtered_stderr.log``, one file per attempt shared by the node's workers.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from elastic_run.agent.output import LineFilter, StreamName

__all__ = ["duplicate_filters", "tee_prefix"]


def tee_prefix(template: str | None, *, role: str, rank: int, local_rank: int) -> str:
    """The prefix of a teed stream's console lines.

    Args:
        template: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` (None or empty: torchrun's default).
        role: the workers' role.
        rank: the worker's global rank.
        local_rank: its local rank.

    Returns:
        The prefix, e.g. ``[default0]:``.
    """
    if not template:
        return f"[{role}{local_rank}]:"
    return Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)


def duplicate_filters(
    stdout_needles: tuple[str, ...],
    stderr_needles: tuple[str, ...],
    attempt_dir: Path,
) -> dict[StreamName, LineFilter]:
    """The filters of one attempt (an empty list of strings: no filter, no file).

    Args:
        stdout_needles: ``--duplicate-stdout-filters``.
        stderr_needles: ``--duplicate-stderr-filters``.
        attempt_dir: ``<run log dir>/attempt_<n>``.

    Returns:
        The filter of each stream that has strings.

    Raises:
        OSError: a file cannot be created.
    """
    filters: dict[StreamName, LineFilter] = {}
    for stream, needles in (
        (StreamName.STDOUT, stdout_needles),
        (StreamName.STDERR, stderr_needles),
    ):
        if needles:
            filters[stream] = LineFilter(needles, attempt_dir / f"filtered_{stream.value}.log")
    return filters
