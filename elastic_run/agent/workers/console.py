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

from collections.abc import Mapping
from pathlib import Path
from string import Template

from elastic_run.agent.workers.output import LineFilter, StreamName
from elastic_run.errors import AgentError

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
    error_files: Mapping[int, str],
) -> dict[StreamName, LineFilter]:
    """The filters of one attempt (an empty list of strings: no filter, no file).

    Args:
        stdout_needles: ``--duplicate-stdout-filters``.
        stderr_needles: ``--duplicate-stderr-filters``.
        error_files: the attempt's error files by local rank
            (``<run log dir>/attempt_<n>/<local rank>/error.json``); the filtered logs go in
            ``attempt_<n>``.

    Returns:
        The filter of each stream that has strings.

    Raises:
        AgentError: a file cannot be created.
    """
    filters: dict[StreamName, LineFilter] = {}
    if not (stdout_needles or stderr_needles) or not error_files:
        return filters
    attempt_dir = Path(next(iter(error_files.values()))).parent.parent
    for stream, needles in (
        (StreamName.STDOUT, stdout_needles),
        (StreamName.STDERR, stderr_needles),
    ):
        if needles:
            try:
                filters[stream] = LineFilter(needles, attempt_dir / f"filtered_{stream.value}.log")
            except OSError as exc:
                raise AgentError(f"cannot create the filtered log: {exc.strerror or exc}") from None
    return filters
