"""Rendezvous settings: ``--rdzv-conf`` and the node counts parsed once, at the edge, into one
frozen object, by one set of checks.

Every key whose meaning is known has one row in :data:`CONF_TABLE` (kind, bounds, default,
torch's older names, help); one parser reads them (:func:`parse_conf_value`), and one parse of a
whole conf (:meth:`RendezvousConf.parse`) gives the :class:`RendezvousSettings` that the
handler, the coordinator, the heartbeat thread and the backends read (the etcd TLS files,
credentials and key prefix included: no backend reads a raw key). Where the conf is parsed:

- the CLI parses ``--rdzv-conf`` once, before anything starts, and hands the result on
  (``RendezvousParameters.from_conf``): nothing parses it again;
- a ``RendezvousParameters`` built from Python with raw strings, as torch users build one,
  is parsed on first use (``RendezvousParameters.settings``) and keeps the result; the
  registry asks for it before touching the network, so a bad value fails there once.

Each backend declares the keys it reads (``CONF_KEYS`` in its module); the handler's own keys
are :data:`HANDLER_KEYS`.

One set of bounds, whatever the path: text from the command line (:func:`parse_conf_value`),
typed values from Python (:class:`RendezvousSettings`, :class:`RendezvousTimeout`,
``from_backend``) and the node counts (:func:`parse_nnodes`, :func:`check_nnodes`, used by the
CLI, ``RendezvousParameters`` and the dynamic handler) all end in the same checks. Durations
must be finite, positive (as torch's ``RendezvousTimeout`` wants, ``last_call_timeout`` too) and
at most a year; ``keep_alive_max_attempt`` an integer (not a bool) in 1..1000; node counts
``1 <= min <= max <=`` :data:`MAX_NODES`. A bad value is a ``ConfigurationError`` (also a
``ValueError``); a value of the wrong type from Python is a :class:`ConfigurationTypeError`
(also a ``TypeError``, as torch raises for it).

torch's timeouts keep torch's meaning: ``join_timeout`` bounds ``next_rendezvous``,
``last_call_timeout`` the wait for more nodes at min, ``close_timeout`` the time within which
``set_closed()`` and ``shutdown()`` complete, ``heartbeat_timeout`` the time within which one
heartbeat completes (see :class:`RendezvousSettings` for where each is used).

A key that torch knows but neither the handler nor this backend uses (``etcd_prefix`` in a
c10d job, ``read_timeout`` in a static one) is ignored with one warning line saying so, as
torchrun ignores it. A key nobody knows is ignored with one warning line naming the keys that
are known.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal, Protocol, TypeGuard

from elastic_run.errors import ConfigurationError

__all__ = [
    "CONF_TABLE",
    "DEFAULT_ELECTION_TIMEOUT_S",
    "DEFAULT_JOIN_TIMEOUT_S",
    "DEFAULT_KEEP_ALIVE_INTERVAL_S",
    "DEFAULT_KEEP_ALIVE_MAX_ATTEMPT",
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_READ_TIMEOUT_S",
    "FILE_STORE_READ_TIMEOUT_S",
    "BACKEND_KEYS",
    "HANDLER_KEYS",
    "MAX_DURATION_S",
    "MAX_KEEP_ALIVE_ATTEMPTS",
    "MAX_NODES",
    "STATIC_KEYS",
    "STATUS_READ_TIMEOUT_S",
    "TORCH_KEYS",
    "ConfKey",
    "ConfSource",
    "ConfigurationTypeError",
    "RendezvousConf",
    "RendezvousSettings",
    "RendezvousTimeout",
    "check_conf_keys",
    "check_conf_values",
    "check_nnodes",
    "check_seconds",
    "check_setting",
    "conf_reference",
    "keys_read_by",
    "parse_bool",
    "parse_conf_value",
    "parse_int",
    "parse_node_count",
    "parse_nnodes",
    "shown",
]

log = logging.getLogger(__name__)

MAX_DURATION_S = 365 * 24 * 3600.0
"""The longest duration: Python's ``timedelta`` and the stores' C++ clocks overflow above it."""
MAX_KEEP_ALIVE_ATTEMPTS = 1000
MAX_NODES = 1_000_000
"""The most nodes of a job: beyond, a typo is likelier than a job, and C++ ints overflow."""
DEFAULT_JOIN_TIMEOUT_S = 600.0  # torch's, for join_timeout and its older name timeout
# The heartbeat budget: a node is judged gone after 5 intervals (and 5 reads) without a beat.
# Long enough that a busy or starved host (a GC pause, a loaded core, thousands of nodes on two
# cores in bench_rendezvous.py) is never judged; short enough that a hung host is dropped in
# about 6 s (5 s, plus up to one interval until its watcher's next read).
DEFAULT_KEEP_ALIVE_INTERVAL_S = 1.0
DEFAULT_KEEP_ALIVE_MAX_ATTEMPT = 5
DEFAULT_READ_TIMEOUT_S = 60.0  # one store call of an agent (c10d's TCPStore timeout, etcd's)
# c10d's store_type=file when no read_timeout is given: torch leaves the FileStore at its own.
FILE_STORE_READ_TIMEOUT_S = 300.0
DEFAULT_KEY_PREFIX = "/elastic-run/"  # where every job's keys live on etcd
# The embedded etcd members' election timeout: a leader whose host died is replaced within one
# or two of them (etcd's own default, 1 s, took 1.0 to 2.0 s of every loss of the leader's host).
DEFAULT_ELECTION_TIMEOUT_S = 0.5
STATUS_READ_TIMEOUT_S = 5.0
"""The ``read_timeout`` of ``elastic-run status`` and ``close`` when ``--rdzv-conf`` gives none.

Shorter than an agent's (``CONF_TABLE['read_timeout']``, 60 s): an agent's store call may wait
out a store that restarts, but an operator's read of a backend that does not answer should say
so in seconds, not hang for a minute.
"""

HANDLER_KEYS = frozenset(
    {
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
    }
)
"""The keys the dynamic handler reads, whatever its backend."""

_ETCD_KEYS = frozenset(
    {
        "read_timeout",
        "protocol",
        "ca_cert",
        "cacert",
        "ssl_cert",
        "cert",
        "ssl_cert_key",
        "key",
        "user",
        "password",
        "key_prefix",
        "local_addr",
    }
)
BACKEND_KEYS: Mapping[str, frozenset[str]] = {
    "c10d": frozenset({"read_timeout", "is_host", "store_type", "use_libuv", "local_addr"}),
    # torch's "etcd" (its legacy handler) reads `timeout` as the join timeout; its "etcd-v2"
    # (the dynamic handler) and c10d never read it.
    "etcd": _ETCD_KEYS | {"timeout"},
    "etcd-v2": _ETCD_KEYS,
    "embedded-etcd": _ETCD_KEYS | {"timeout", "election_timeout"},
    "memory": frozenset(),
}
"""The keys each built-in backend of the dynamic handler reads itself, beside HANDLER_KEYS."""
STATIC_KEYS = frozenset({"rank", "timeout", "join_timeout", "local_addr"})
"""The keys the static rendezvous reads (it reads none of the dynamic handler's)."""


def conf_reference() -> str:
    """The docs' table of the ``--rdzv-conf`` keys, made from :data:`CONF_TABLE` (markdown).

    One row a key: its name (and torch's older names), kind, default, the built-in backends
    that read it, and its help. ``docs/backends.md`` holds it verbatim (a test keeps it so).
    """
    rows = ["| key | kind | default | read by | what |", "|---|---|---|---|---|"]
    backends = ("c10d", "etcd", "etcd-v2", "embedded-etcd", "static")
    for key, spec in CONF_TABLE.items():
        name = f"`{key}`" + "".join(f" (`{a}`)" for a in spec.aliases)
        kind = "/".join(spec.choices) if spec.kind == "choice" else spec.kind
        default = (
            ""
            if spec.default is None
            else f"{spec.default:g}"
            if isinstance(spec.default, float)
            else str(spec.default)
        )
        readers = [b for b in backends if key in (keys_read_by(b) or ())]
        read_by = "all" if len(readers) == len(backends) else ", ".join(readers)
        rows.append(f"| {name} | {kind} | {default} | {read_by} | {spec.help} |")
    return "\n".join(rows) + "\n"


def keys_read_by(backend: str) -> frozenset[str] | None:
    """The ``--rdzv-conf`` keys the built-in backend ``backend`` reads; None for another one.

    Only these are parsed for it: a key its backend never reads is never refused (torchrun's
    rule: each backend reads the keys it knows), only named in one warning line.
    """
    if backend == "static":
        return STATIC_KEYS
    own = BACKEND_KEYS.get(backend)
    return None if own is None else HANDLER_KEYS | own


# Every key some torch rendezvous backend reads: passed by scripts written for torchrun.
TORCH_KEYS = HANDLER_KEYS | frozenset(
    {
        "timeout",
        "read_timeout",
        "is_host",
        "store_type",
        "use_libuv",
        "local_addr",
        "rank",
        "protocol",
        "cacert",
        "cert",
        "key",
        "ca_cert",
        "ssl_cert",
        "ssl_cert_key",
        "etcd_prefix",
        "key_prefix",
    }
)

# torch's spellings of a boolean (RendezvousParameters.get_as_bool), in any case: the one table.
_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_FALSE = frozenset({"0", "false", "f", "no", "n"})
_SHOWN_CHARS = 60
_INT_RE = re.compile(r"[+-]?[0-9]+")
_MAX_INT_DIGITS = 30  # more digits than any bound here has: "far too large", not a parse


class ConfigurationTypeError(ConfigurationError, TypeError):
    """A setting given from Python with the wrong type (a str or a bool where a number is due).

    Both a :class:`ConfigurationError` (a ``ValueError``; the CLI exits 2) and the ``TypeError``
    that Python code, and torch for the same call, raise for a value of the wrong type.
    """


@dataclass(frozen=True)
class ConfKey:
    """What a ``--rdzv-conf`` key holds: its kind, its default, its help and its other names.

    Kinds: ``seconds`` (finite, > 0, at most a year), ``attempts`` (a whole number 1..1000),
    ``bool`` (torch's spellings), ``choice``, ``text`` (a file path, a name: taken as given,
    white space around it stripped; empty reads as not given), ``rank`` (a whole number
    ``0..MAX_NODES-1``).

    Attributes:
        aliases: torch's older names of the key (``cacert`` for ``ca_cert``); the key's own
            name wins when both are given.
        secret: never shown (a password).
    """

    kind: Literal["seconds", "attempts", "bool", "choice", "text", "rank"]
    default: float | int | bool | str | None
    help: str = ""
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    secret: bool = False


# The one table of the keys whose meaning is known: kinds, bounds, defaults, help, other names.
CONF_TABLE: Mapping[str, ConfKey] = {
    "join_timeout": ConfKey(
        "seconds", DEFAULT_JOIN_TIMEOUT_S, "how long next_rendezvous may take (s)"
    ),
    "timeout": ConfKey(
        "seconds",
        DEFAULT_JOIN_TIMEOUT_S,
        "torch's older name of join_timeout, read where torch reads it (its etcd, static)",
    ),
    "last_call_timeout": ConfKey(
        "seconds", 30.0, "how long a round at min nodes waits for more (s)"
    ),
    "close_timeout": ConfKey(
        "seconds", 30.0, "the time within which set_closed() and shutdown() complete (s)"
    ),
    "heartbeat_timeout": ConfKey(
        "seconds", 5.0, "the time within which one heartbeat completes (s)"
    ),
    "keep_alive_interval": ConfKey(
        "seconds", DEFAULT_KEEP_ALIVE_INTERVAL_S, "the time between two heartbeats (s)"
    ),
    "keep_alive_max_attempt": ConfKey(
        "attempts",
        DEFAULT_KEEP_ALIVE_MAX_ATTEMPT,
        "heartbeat intervals without a beat after which a node is gone",
    ),
    "read_timeout": ConfKey(
        "seconds",
        DEFAULT_READ_TIMEOUT_S,
        "how long one store call may take (s; a c10d file store: 300, as torch's)",
    ),
    "election_timeout": ConfKey(
        "seconds",
        DEFAULT_ELECTION_TIMEOUT_S,
        "embedded-etcd: the members' raft election timeout (s; 0.05..50), a beat every tenth",
    ),
    "is_host": ConfKey("bool", None, "c10d: host the store here (unset: when it is this host)"),
    "use_libuv": ConfKey("bool", None, "c10d: the TCPStore server's libuv loop (torch's default)"),
    "store_type": ConfKey(
        "choice", "tcp", "c10d: a TCPStore, or a FileStore at the endpoint path", ("tcp", "file")
    ),
    "protocol": ConfKey("choice", "http", "etcd: the client URLs' scheme", ("http", "https")),
    "ca_cert": ConfKey(
        "text", None, "etcd: the CA certificate file to verify the servers", aliases=("cacert",)
    ),
    "ssl_cert": ConfKey("text", None, "etcd: this client's certificate file", aliases=("cert",)),
    "ssl_cert_key": ConfKey("text", None, "etcd: this client's private key file", aliases=("key",)),
    "user": ConfKey("text", None, "etcd: the user name of etcd's authentication"),
    "password": ConfKey("text", None, "etcd: the user's password", secret=True),
    "key_prefix": ConfKey(
        "text", DEFAULT_KEY_PREFIX, "etcd: the prefix every job's keys live under"
    ),
    "rank": ConfKey("rank", None, "static: this node's rank (--node-rank)"),
}
_ALIASES: Mapping[str, str] = {
    alias: key for key, spec in CONF_TABLE.items() for alias in spec.aliases
}


class ConfSource(Protocol):
    """What the settings read of a ``RendezvousParameters``: its backend, config and parse."""

    backend: str
    config: dict[str, Any]

    @property
    def settings(self) -> RendezvousSettings:
        """The config's one parse."""
        ...


def shown(raw: object) -> str:
    """Return ``raw`` fit for a one-line message: at most 60 characters, text quoted.

    Text is shown with control and non-ASCII characters escaped (``ascii``), anything else as
    its ``repr``; longer than 60 characters, it is cut and ends in ``...``.
    """
    text = raw if isinstance(raw, str) else repr(raw)
    short = text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
    return ascii(short) if isinstance(raw, str) else short


def parse_int(text: str, what: str) -> int:
    """Parse a whole number written in ASCII digits, with an optional sign: the one reader.

    Args:
        text: the value (white space around it is ignored).
        what: the flag, key or variable it came from, for the message.

    Returns:
        The number.

    Raises:
        ConfigurationError: not a whole number, or more than 30 digits long.
    """
    value = text.strip()
    if not _INT_RE.fullmatch(value):
        raise ConfigurationError(f"{what} {shown(text)} is not a whole number")
    return _whole(value, what, text)


def _whole(digits: str, what: str, text: str) -> int:
    if len(digits.strip().lstrip("+-")) > _MAX_INT_DIGITS:
        raise ConfigurationError(f"{what} {shown(text)} is far too large")
    return int(digits)


# -- the checks: one per kind, for every path ------------------------------------------------


def check_seconds(value: float, what: str, *, allow_zero: bool = False) -> float:
    """Check a duration in seconds: finite, positive (or zero) and at most a year.

    Args:
        value: the duration.
        what: the flag or key, for the message (``--rdzv-conf join_timeout``).
        allow_zero: whether 0 is allowed (no rendezvous key allows it; some CLI flags do).

    Returns:
        ``value`` as a float.

    Raises:
        ConfigurationError: NaN, infinite, negative, zero when not allowed, or above a year.
    """
    try:
        seconds = float(value)
    except OverflowError:  # an int past a float's range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what} {seconds} is not a finite number of seconds")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "not be negative" if allow_zero else "be positive"
        raise ConfigurationError(f"{what} {seconds:g} must {bound}")
    if seconds > MAX_DURATION_S:
        raise ConfigurationError(
            f"{what} {seconds:g} is more than a year ({MAX_DURATION_S:.0f} s), the longest "
            "duration the stores' clocks take"
        )
    return seconds


def _check_attempts(count: int, what: str) -> int:
    if not 1 <= count <= MAX_KEEP_ALIVE_ATTEMPTS:
        raise ConfigurationError(f"{what} {count} is out of range (1..{MAX_KEEP_ALIVE_ATTEMPTS})")
    return count


def _check_choice(key: str, value: str, what: str) -> str:
    choices = CONF_TABLE[key].choices
    if value not in choices:
        raise ConfigurationError(f"{what} {shown(value)} must be {' or '.join(choices)}")
    return value


def check_setting(key: str, value: object, what: str | None = None) -> object:
    """Check one value of a key of :data:`CONF_TABLE` as Python holds it (not text).

    The typed paths (:class:`RendezvousSettings`, :class:`RendezvousTimeout`, ``from_backend``)
    check here; :func:`parse_conf_value` parses text and ends in the same bounds.

    Args:
        key: the key (must be in the table).
        value: seconds as an int or a float, attempts as an int, a bool (or None: the backend's
            default), a choice as a lower-case str.
        what: the name for the message (default ``--rdzv-conf KEY``).

    Returns:
        The value (seconds as a float).

    Raises:
        ConfigurationTypeError: the value is of the wrong type (a bool or a str for a number,
            a float for attempts).
        ConfigurationError: the value is out of the key's bounds.
    """
    kind = CONF_TABLE[key].kind
    name = what or f"--rdzv-conf {key}"
    if kind == "seconds":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigurationTypeError(f"{name} {shown(value)} is not a number of seconds")
        return check_seconds(float(value), name)
    if kind == "attempts":
        if not _is_whole(value):
            raise ConfigurationTypeError(
                f"{name} {shown(value)} is not a whole number in 1..{MAX_KEEP_ALIVE_ATTEMPTS}"
            )
        return _check_attempts(int(value), name)
    if kind == "bool":
        if value is not None and not isinstance(value, bool):
            raise ConfigurationTypeError(f"{name} {shown(value)} is not a bool")
        return value
    if kind == "rank":
        if value is None:
            return None
        if not _is_whole(value):
            raise ConfigurationTypeError(f"{name} {shown(value)} is not a whole number")
        return _check_rank(int(value), name)
    if kind == "text":
        if value is not None and not isinstance(value, str):
            raise ConfigurationTypeError(f"{name} {shown(value)} is not a str")
        return value
    if not isinstance(value, str):
        raise ConfigurationTypeError(f"{name} {shown(value)} is not a str")
    return _check_choice(key, value.strip().lower(), name)


def _check_rank(rank: int, what: str) -> int:
    if not 0 <= rank < MAX_NODES:
        raise ConfigurationError(f"{what} {rank} is out of range (0..{MAX_NODES - 1})")
    return rank


def parse_bool(raw: object, what: str) -> bool:
    """Read a boolean as torch's ``RendezvousParameters.get_as_bool`` does: the one reader.

    Args:
        raw: a bool; the int 1 or 0; or text ``1/0``, ``true/false``, ``t/f``, ``yes/no``,
            ``y/n`` in any case (white space around it ignored).
        what: the key, for the message.

    Returns:
        The boolean.

    Raises:
        ConfigurationError: anything else.
    """
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str):
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise ConfigurationError(
        f"{what} {shown(raw)} is not a boolean (1/0, true/false, t/f, yes/no, y/n)"
    )


def parse_conf_value(key: str, raw: object) -> float | int | bool | str:
    """Parse one ``--rdzv-conf`` value of a key in :data:`CONF_TABLE`: the only parser of them.

    Args:
        key: the key (must be in the table).
        raw: the value as given (text from the command line, or a number or bool from Python).

    Returns:
        The value: seconds as a float, attempts and ranks as ints, a bool, a choice in lower
        case, text stripped.

    Raises:
        ConfigurationError: the value is not of the key's kind or out of its bounds (NaN,
            infinite, not positive, more than a year, not a whole number).
    """
    spec = CONF_TABLE[key]
    what = f"--rdzv-conf {key}"
    text = str(raw).strip()
    if spec.kind == "text":
        return text
    if spec.kind == "rank":
        if isinstance(raw, bool):
            raise ConfigurationError(f"{what} {shown(raw)} is not a whole number")
        return _check_rank(parse_int(text, what), what)
    if spec.kind == "seconds":
        try:
            value = float(text)
        except ValueError:
            raise ConfigurationError(f"{what} {shown(raw)} is not a number of seconds") from None
        return check_seconds(value, what)
    if spec.kind == "attempts":
        if isinstance(raw, bool) or not (text.isascii() and text.isdigit()) or len(text) > 9:
            raise ConfigurationError(
                f"{what} {shown(raw)} is not a whole number in 1..{MAX_KEEP_ALIVE_ATTEMPTS}"
            )
        return _check_attempts(int(text), what)
    if spec.kind == "bool":
        return parse_bool(raw, what)
    return _check_choice(key, text.lower(), what)


def check_conf_values(
    config: Mapping[str, object], read: Iterable[str] | None = None
) -> dict[str, float | int | bool | str]:
    """Parse every key of ``config`` whose meaning is known; other keys pass untouched.

    torch's older name of a key (``cacert``) is read as the key (``ca_cert``); when both are
    given, the key's own name wins. A text value that is empty reads as not given.

    Args:
        config: the keys and values as given.
        read: the keys the backend reads (:func:`keys_read_by`): only those are parsed; None
            parses every key of the table (a backend of a plugin).

    Returns:
        The parsed values of the known keys given, under their own names.

    Raises:
        ConfigurationError: a known key has a bad value (see :func:`parse_conf_value`).
    """
    wanted = None if read is None else frozenset(read)
    values: dict[str, float | int | bool | str] = {}
    for given, raw in config.items():
        key = _ALIASES.get(given, given)
        if key not in CONF_TABLE or raw is None or (key != given and key in config):
            continue
        if wanted is not None and given not in wanted:
            continue
        value = parse_conf_value(key, raw)
        if CONF_TABLE[key].kind == "text" and value == "":
            continue
        values[key] = value
    return values


def check_conf_keys(
    params: ConfSource, backend_keys: Iterable[str], backend: str
) -> tuple[str, ...]:
    """Warn (one line each kind) about keys this backend ignores; return them.

    Args:
        params: the parameters whose ``config`` to check.
        backend_keys: the keys the backend reads (beside :data:`HANDLER_KEYS`).
        backend: the backend's name, for the message.
    """
    used = keys_read_by(backend) or (HANDLER_KEYS | frozenset(backend_keys))
    given = set(params.config)
    foreign = sorted((given - used) & TORCH_KEYS)
    unknown = sorted(given - used - TORCH_KEYS)
    if foreign:
        log.warning(
            "--rdzv-conf %s: not used by the %s rendezvous backend (ignored)",
            ", ".join(foreign),
            backend,
        )
    if unknown:
        log.warning(
            "--rdzv-conf %s: unknown key%s (ignored); the %s backend reads: %s",
            ", ".join(unknown),
            "s" if len(unknown) > 1 else "",
            backend,
            ", ".join(sorted(used)),
        )
    return tuple(foreign + unknown)


# -- node counts ------------------------------------------------------------------------------


def check_nnodes(
    min_nodes: int, max_nodes: int, what: str = "--nnodes", given: str | None = None
) -> tuple[int, int]:
    """Check node counts: ``1 <= min <= max <= MAX_NODES``, the one bound of them.

    Args:
        min_nodes: the fewest nodes a round completes with.
        max_nodes: the most nodes a round admits.
        what: the flag or argument, for the message.
        given: the value as the user wrote it, for the message (default ``MIN:MAX``).

    Returns:
        ``(min_nodes, max_nodes)``.

    Raises:
        ConfigurationTypeError: a count is not an int (a bool neither).
        ConfigurationError: the counts are out of those bounds (a ``ValueError``, as torch's).
    """
    for count in (min_nodes, max_nodes):
        if not _is_whole(count):
            raise ConfigurationTypeError(f"{what} {shown(count)} is not a whole number of nodes")
    min_nodes, max_nodes = int(min_nodes), int(max_nodes)
    written = given if given is not None else f"{min_nodes}:{max_nodes}"
    if min_nodes < 1:
        raise ConfigurationError(f"{what} {written}: the node count must be at least 1")
    if max_nodes < min_nodes:
        raise ConfigurationError(f"{what} {written}: MAX must not be less than MIN")
    if max_nodes > MAX_NODES:
        raise ConfigurationError(
            f"{what} {written}: more than {MAX_NODES} nodes is not a job this launcher runs"
        )
    return min_nodes, max_nodes


def _is_whole(value: object) -> TypeGuard[numbers.Integral]:
    """An integer from Python (numpy's too, as torch takes them), a bool not."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def parse_nnodes(text: str, what: str = "--nnodes") -> tuple[int, int]:
    """Parse ``N`` or ``MIN:MAX`` into ``(min, max)``, then :func:`check_nnodes` them.

    Args:
        text: the ``--nnodes`` value (white space around it is ignored).
        what: the flag or variable it came from, for the message.

    Returns:
        ``(min, max)`` with ``1 <= min <= max <= MAX_NODES``.

    Raises:
        ConfigurationError: the text is not of that form or a count is out of range.
    """
    parts = [p.strip() for p in text.strip().split(":")]
    if len(parts) > 2 or not all(_INT_RE.fullmatch(p) for p in parts):
        raise ConfigurationError(f"{what} {shown(text)} is not N or MIN:MAX")
    low, high = (_whole(p, what, text) for p in (parts[0], parts[-1]))
    return check_nnodes(low, high, what, shown(text))


def parse_node_count(text: str, what: str) -> int:
    """Parse one node count ``N`` (no ``MIN:MAX``), bounded as :func:`parse_nnodes` bounds it.

    Args:
        text: the value (``4``; the MIN of ``--nnodes 4:``, ``SLURM_JOB_NUM_NODES``).
        what: the flag or variable it came from, for the message.

    Returns:
        The count, in ``1..MAX_NODES``.

    Raises:
        ConfigurationError: not a whole number, or out of range.
    """
    if not _INT_RE.fullmatch(text.strip()):
        raise ConfigurationError(f"{what} {shown(text)} is not a whole number of nodes")
    count = _whole(text, what, text)
    return check_nnodes(count, count, what, shown(text))[0]


# -- torch's typed timeouts, and the frozen settings -------------------------------------------


def _default(key: str) -> Any:
    return CONF_TABLE[key].default


class RendezvousTimeout:
    """torch's timeouts of the dynamic rendezvous (``None``: the default of each).

    Args:
        join: how long a rendezvous may take (``join_timeout`` in :data:`CONF_TABLE`, 600 s).
        last_call: how long a round at min nodes waits for more (30 s).
        close: the bound on closing and leaving (30 s).
        heartbeat: the deadline of one heartbeat (5 s).

    Raises:
        ConfigurationError: a timeout is not positive or is more than a year (a ``ValueError``,
            as torch's).
        ConfigurationTypeError: a timeout is not a ``timedelta``.
    """

    _NAMES = ("join", "last_call", "close", "heartbeat")

    def __init__(
        self,
        join: timedelta | None = None,
        last_call: timedelta | None = None,
        close: timedelta | None = None,
        heartbeat: timedelta | None = None,
    ) -> None:
        given = {"join": join, "last_call": last_call, "close": close, "heartbeat": heartbeat}
        self._values: dict[str, timedelta] = {}
        for name in self._NAMES:
            value = given[name]
            what = f"the {name} timeout"
            if value is None:
                value = timedelta(seconds=_default(f"{name}_timeout"))
            elif not isinstance(value, timedelta):
                raise ConfigurationTypeError(f"{what} {shown(value)} is not a timedelta")
            check_setting(f"{name}_timeout", value.total_seconds(), what)
            self._values[name] = value

    @property
    def join(self) -> timedelta:
        """How long a rendezvous may take."""
        return self._values["join"]

    @property
    def last_call(self) -> timedelta:
        """How long a round at min nodes waits for more."""
        return self._values["last_call"]

    @property
    def close(self) -> timedelta:
        """The bound on closing and leaving."""
        return self._values["close"]

    @property
    def heartbeat(self) -> timedelta:
        """The deadline of one heartbeat."""
        return self._values["heartbeat"]


# Each field of RendezvousSettings and the CONF_TABLE key it holds.
_FIELD_KEYS: Mapping[str, str] = {
    "join_timeout_s": "join_timeout",
    "last_call_timeout_s": "last_call_timeout",
    "close_timeout_s": "close_timeout",
    "heartbeat_timeout_s": "heartbeat_timeout",
    "keep_alive_interval_s": "keep_alive_interval",
    "keep_alive_max_attempt": "keep_alive_max_attempt",
    "read_timeout_s": "read_timeout",
    "election_timeout_s": "election_timeout",
    "is_host": "is_host",
    "use_libuv": "use_libuv",
    "store_type": "store_type",
    "protocol": "protocol",
    "ca_cert": "ca_cert",
    "ssl_cert": "ssl_cert",
    "ssl_cert_key": "ssl_cert_key",
    "user": "user",
    "password": "password",
    "key_prefix": "key_prefix",
    "rank": "rank",
}


@dataclass(frozen=True)
class RendezvousSettings:
    """``--rdzv-conf`` as the rendezvous reads it (torch's names, ``_s`` for seconds).

    Every default is :data:`CONF_TABLE`'s, and every value is checked by :func:`check_setting`.

    Attributes:
        join_timeout_s: how long ``next_rendezvous`` may take.
        last_call_timeout_s: how long a round at min nodes waits for more.
        close_timeout_s: torch's "time within which the rendezvous is expected to close after a
            call to set_closed() or shutdown()": ``set_closed`` tries its compare-and-set until
            then, and ``shutdown`` waits that long at most for the liveness turn to end.
        heartbeat_timeout_s: torch's "time within which a keep-alive heartbeat is expected to
            complete": a heartbeat's store calls give up after it (etcd: the calls' deadline;
            c10d: a link whose data stays unacknowledged that long is reset), bounded by
            ``read_timeout_s`` and the heartbeat budget (:attr:`heartbeat_deadline_s`); a
            heartbeat that failed is reported (``LivenessReport``) and the next one is tried an
            interval later.
        keep_alive_interval_s: how often a node bumps its heartbeat.
        keep_alive_max_attempt: how many intervals without a move make a node gone; a reader
            also needs as many reads that found the counter unchanged (``protocol.Heartbeats``),
            so its own stall never convicts another node.
        read_timeout_s: how long one store call may take (the backends').
        election_timeout_s: the embedded etcd members' raft election timeout (they beat every
            tenth of it).
        is_host, use_libuv, store_type, protocol: the backends' switches (None: their default).
        ca_cert, ssl_cert, ssl_cert_key: etcd's TLS files (None: none given).
        user, password: etcd's authentication (the password is never shown).
        key_prefix: where every job's keys live on etcd.
        rank: the static rendezvous's node rank (None: not given).

    Raises:
        ConfigurationTypeError: a value of the wrong type.
        ConfigurationError: a value out of its bounds.
    """

    join_timeout_s: float = _default("join_timeout")
    last_call_timeout_s: float = _default("last_call_timeout")
    close_timeout_s: float = _default("close_timeout")
    heartbeat_timeout_s: float = _default("heartbeat_timeout")
    keep_alive_interval_s: float = _default("keep_alive_interval")
    keep_alive_max_attempt: int = _default("keep_alive_max_attempt")
    read_timeout_s: float = _default("read_timeout")
    election_timeout_s: float = _default("election_timeout")
    is_host: bool | None = _default("is_host")
    use_libuv: bool | None = _default("use_libuv")
    store_type: str = _default("store_type")
    protocol: str = _default("protocol")
    ca_cert: str | None = None
    ssl_cert: str | None = None
    ssl_cert_key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    key_prefix: str = _default("key_prefix")
    rank: int | None = None

    def __post_init__(self) -> None:
        for name, key in _FIELD_KEYS.items():
            check_setting(key, getattr(self, name), name)

    @property
    def stale_after_s(self) -> float:
        """How long a heartbeat may stand still before its node is judged gone."""
        return self.keep_alive_interval_s * self.keep_alive_max_attempt

    @property
    def heartbeat_deadline_s(self) -> float:
        """How long one heartbeat's store calls may take: ``heartbeat_timeout``, at most the
        read timeout and the heartbeat budget, at least a second."""
        return max(1.0, min(self.heartbeat_timeout_s, self.read_timeout_s, self.stale_after_s))

    @classmethod
    def parse(cls, config: Mapping[str, object], backend: str | None = None) -> RendezvousSettings:
        """The settings of ``config`` (``--rdzv-conf`` as given): the one parse of it.

        ``join_timeout`` wins over torch's older ``timeout``; a key not given takes
        :data:`CONF_TABLE`'s default; keys the table does not know, and keys ``backend`` does
        not read (:func:`keys_read_by`), are left to whoever reads them.

        Args:
            config: the keys and values as given.
            backend: the backend's name (None, or one not built in: every known key).

        Raises:
            ConfigurationError: a key the backend reads has a bad value.
        """
        values = check_conf_values(config, keys_read_by(backend) if backend else None)
        fields: dict[str, Any] = {
            name: values[key] for name, key in _FIELD_KEYS.items() if key in values
        }
        if "join_timeout" not in values and "timeout" in values:
            fields["join_timeout_s"] = values["timeout"]
        if "read_timeout" not in values and values.get("store_type") == "file":
            fields["read_timeout_s"] = FILE_STORE_READ_TIMEOUT_S  # torch's: the FileStore's own
        return cls(**fields)

    @classmethod
    def from_timeout(
        cls,
        timeout: RendezvousTimeout | None,
        keep_alive_interval_s: float,
        keep_alive_max_attempt: int,
    ) -> RendezvousSettings:
        """Settings from torch's ``RendezvousTimeout`` and keep-alive numbers (``from_backend``).

        Raises:
            ConfigurationTypeError: a keep-alive value of the wrong type (a bool, a str; a float
                for the attempts).
            ConfigurationError: a keep-alive value out of its bounds.
        """
        t = timeout or RendezvousTimeout()
        return cls(
            join_timeout_s=t.join.total_seconds(),
            last_call_timeout_s=t.last_call.total_seconds(),
            close_timeout_s=t.close.total_seconds(),
            heartbeat_timeout_s=t.heartbeat.total_seconds(),
            keep_alive_interval_s=keep_alive_interval_s,
            keep_alive_max_attempt=keep_alive_max_attempt,
        )

    @classmethod
    def from_params(
        cls, params: ConfSource, backend_keys: Iterable[str] | None = None
    ) -> RendezvousSettings:
        """The settings of ``params`` (its one parse, ``params.settings``); warn about keys
        nobody reads.

        Args:
            params: the rendezvous parameters.
            backend_keys: the keys the backend reads itself; None to read without warning
                about keys.

        Raises:
            ConfigurationError: a known key has a bad value.
        """
        if backend_keys is not None:
            check_conf_keys(params, backend_keys, params.backend)
        return params.settings


@dataclass(frozen=True)
class RendezvousConf:
    """``--rdzv-conf`` as the user gave it and as it was parsed, once, at the edge.

    Attributes:
        given: the pairs as given, every key (a plugin or a backend reads keys of its own), in
            the order first given.
        values: the parsed values of the keys :data:`CONF_TABLE` knows (what
            :func:`check_conf_values` returned).
        settings: the settings those values make.
    """

    given: tuple[tuple[str, str], ...] = ()
    values: Mapping[str, float | int | bool | str] = field(default_factory=dict)
    settings: RendezvousSettings = field(default_factory=lambda: RendezvousSettings())

    @classmethod
    def parse(cls, given: Iterable[tuple[str, str]], backend: str | None = None) -> RendezvousConf:
        """Parse ``given`` (``k=v`` pairs already split): the one parse of a conf.

        Args:
            given: the pairs.
            backend: the backend's name: only the keys it reads are parsed (see
                :meth:`RendezvousSettings.parse`).

        Raises:
            ConfigurationError: a key the backend reads has a bad value.
        """
        pairs = tuple(given)
        read = keys_read_by(backend) if backend else None
        values = check_conf_values(dict(pairs), read)
        return cls(pairs, values, RendezvousSettings.parse(dict(pairs), backend))

    def with_default(self, key: str, value: float | int | bool | str) -> RendezvousConf:
        """This conf with ``key`` set to ``value`` unless given (``status``'s shorter read
        timeout); the value is checked as a typed one (:func:`check_setting`).

        Raises:
            ConfigurationError: the value is out of the key's bounds.
        """
        if key in dict(self.given) or key in self.values:
            return self
        checked: Any = check_setting(key, value)
        name = next(n for n, k in _FIELD_KEYS.items() if k == key)
        text = f"{checked:g}" if isinstance(checked, float) else str(checked)
        return RendezvousConf(
            (*self.given, (key, text)),
            {**self.values, key: checked},
            replace(self.settings, **{name: checked}),
        )
