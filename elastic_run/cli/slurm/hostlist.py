"""Slurm's hostlist grammar: expand ``n[01-04,07],login`` into host names, with python-hostlist.

One concept: the compact host list notation Slurm uses in ``SLURM_JOB_NODELIST`` and in
``scontrol`` output, expanded by python-hostlist (the library HPC sites use, NSC's), behind our
errors: no ``scontrol show hostnames`` needed.

Grammar (the library's): a comma list of names at the top level; a name holds literal text and
bracket groups; a group holds a comma list of ``N`` or ``LO-HI`` (ASCII digits). A range keeps
the width of its lower bound (``[08-10]`` is 08, 09, 10); several groups in one name multiply
out in order (``r[1-2]n[1-2]`` is r1n1, r1n2, r2n1, r2n2).

What this module adds to the library: the expression is stripped, and an empty expression or an
empty name (``a,,b``) is an error (the library skips it); duplicates are kept (the library drops
them unless asked); every fault is one :class:`ConfigurationError` naming the expression (exit 2
at the CLI), never the library's ``BadHostlist``; and the whole list is bounded by
:data:`MAX_HOSTS`, counted as each top-level name is expanded, so that no expression, however
long, holds more than that in memory (the library bounds one name to its ``MAX_SIZE``, 100,000).

Invariants: pure functions of their argument; a malformed expression raises
``ConfigurationError``, never another exception; the library is imported only when a list is
expanded (missing, it is one ``ConfigurationError`` line).
"""

from __future__ import annotations

from types import ModuleType

from elastic_run.errors import ConfigurationError

__all__ = ["MAX_HOSTS", "expand_hostlist", "first_host"]

MAX_HOSTS = 1_000_000
"""The most names :func:`expand_hostlist` lists (the launcher's bound on a job's nodes)."""

_TOO_LARGE = ("range too large", "results too large")


def _library() -> ModuleType:
    """python-hostlist, imported when a node list is read (every run imports this module; only
    one in a Slurm allocation needs it: a GPU check's machine may not have it).

    Raises:
        ConfigurationError: it is not installed, in one line that says what to install.
    """
    try:
        import hostlist
    except ImportError:
        raise ConfigurationError(
            "reading a Slurm node list needs python-hostlist: pip install python-hostlist"
        ) from None
    library: ModuleType = hostlist
    return library


def _top_level_names(spec: str) -> list[str]:
    """Split at the commas outside brackets (the library checks the brackets themselves)."""
    names: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(spec):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            names.append(spec[start:index])
            start = index + 1
    names.append(spec[start:])
    return names


def _expand_one(name: str, spec: str) -> list[str]:
    library = _library()
    try:
        return list(library.expand_hostlist(name, allow_duplicates=True))
    except library.BadHostlist as exc:
        why = str(exc)
        if why in _TOO_LARGE:
            raise ConfigurationError(
                f"hostlist {spec[:60]!r}: {name[:60]!r} names more than {library.MAX_SIZE} "
                "hosts (a typo?)"
            ) from None
        raise ConfigurationError(f"hostlist {spec!r}: {why} in {name!r}") from None


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
        ConfigurationError: the expression or one of its names is empty, its brackets do not
            balance or nest, a range is reversed or holds something other than digits, one
            name holds more than the library's 100,000 hosts, or the whole more than
            :data:`MAX_HOSTS`.
    """
    stripped = spec.strip()
    if not stripped:
        raise ConfigurationError(f"hostlist {spec!r} is empty")
    if stripped.count("[") != stripped.count("]"):
        raise ConfigurationError(f"hostlist {spec!r}: unbalanced brackets")
    hosts: list[str] = []
    for name in _top_level_names(stripped):
        name = name.strip()
        if not name:
            raise ConfigurationError(f"hostlist {spec!r}: empty host name")
        hosts += _expand_one(name, spec)
        if len(hosts) > MAX_HOSTS:
            raise ConfigurationError(
                f"hostlist {spec[:60]!r}: names more than {MAX_HOSTS} hosts (a typo?)"
            )
    return hosts


def first_host(spec: str) -> str:
    """Return the first host of a Slurm hostlist expression.

    Args:
        spec: a hostlist expression (``127.0.0.[1-2]``).

    Returns:
        The first host name (``127.0.0.1``).

    Raises:
        ConfigurationError: the expression is malformed or too large (see
            :func:`expand_hostlist`: the whole expression is checked).
    """
    return expand_hostlist(spec)[0]
