"""Rendezvous settings: ``--rdzv-conf`` parsed once, at the edge, into one frozen object.

Every key is read here and nowhere else, by one parser (:func:`parse_conf_value`) over one table
of kinds, bounds and defaults (:data:`CONF_TABLE`); the handler, the coordinator, the heartbeat
thread and the backends get the parsed numbers of one :class:`RendezvousSettings`, parsed once
per ``RendezvousParameters`` (:meth:`RendezvousSettings.from_params` keeps what it parsed while
the parameters' config is unchanged). The CLI checks ``--rdzv-conf`` with the same parser before
anything starts, and ``from_backend`` takes the same defaults. Each backend declares the keys it
reads (``CONF_KEYS`` in its module); the handler's own keys are :data:`HANDLER_KEYS`.

A key that torch knows but neither the handler nor this backend uses (``etcd_prefix`` in a
c10d job, ``join_timeout`` in a static one) is ignored with one warning line saying so, as
torchrun ignores it. A key nobody knows is ignored with one warning line naming the keys that
are known. A known key with a bad value is a ``ConfigurationError`` (also a ``ValueError``):
durations must be finite, positive (``last_call_timeout`` may be 0) and at most a year;
``keep_alive_max_attempt`` an integer in 1..1000.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters

__all__ = [
    "CONF_TABLE",
    "DEFAULT_KEEP_ALIVE_INTERVAL_S",
    "DEFAULT_KEEP_ALIVE_MAX_ATTEMPT",
    "HANDLER_KEYS",
    "MAX_KEEP_ALIVE_ATTEMPTS",
    "ConfKey",
    "RendezvousTimeout",
    "MAX_DURATION_S",
    "TORCH_KEYS",
    "RendezvousSettings",
    "check_conf_keys",
    "check_conf_values",
    "conf_seconds",
    "parse_conf_value",
]

log = logging.getLogger(__name__)

MAX_DURATION_S = 365 * 24 * 3600.0
MAX_KEEP_ALIVE_ATTEMPTS = 1000
_MAX_ATTEMPTS = MAX_KEEP_ALIVE_ATTEMPTS
# The heartbeat budget: a node is judged gone after 5 intervals (and 5 reads) without a beat.
# Long enough that a busy or starved host (a GC pause, a loaded core, thousands of nodes on two
# cores in bench_rendezvous.py) is never judged; short enough that a hung host is dropped in
# about 6 s (5 s, plus up to one interval until its watcher's next read).
DEFAULT_KEEP_ALIVE_INTERVAL_S = 1.0
DEFAULT_KEEP_ALIVE_MAX_ATTEMPT = 5

HANDLER_KEYS = frozenset(
    {
        "join_timeout",
        "timeout",  # torch's older name of join_timeout (etcd-v2, static)
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
    }
)

# Every key some torch rendezvous backend reads: passed by scripts written for torchrun.
TORCH_KEYS = HANDLER_KEYS | frozenset(
    {
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


_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_FALSE = frozenset({"0", "false", "f", "no", "n"})
_SHOWN_CHARS = 60


@dataclass(frozen=True)
class ConfKey:
    """What a ``--rdzv-conf`` key holds: its kind, its default and (for a choice) its values.

    Kinds: ``seconds`` (finite, > 0, at most a year), ``seconds0`` (the same, 0 allowed),
    ``attempts`` (a whole number 1..1000), ``bool`` (torch's spellings), ``choice``.
    """

    kind: Literal["seconds", "seconds0", "attempts", "bool", "choice"]
    default: float | int | bool | str | None
    choices: tuple[str, ...] = ()


# The one table of the keys whose meaning is known: kinds, bounds and defaults.
CONF_TABLE: Mapping[str, ConfKey] = {
    "join_timeout": ConfKey("seconds", 600.0),
    "timeout": ConfKey("seconds", None),  # torch's older name of join_timeout
    "last_call_timeout": ConfKey("seconds0", 30.0),
    "close_timeout": ConfKey("seconds", 30.0),
    "heartbeat_timeout": ConfKey("seconds", 5.0),
    "keep_alive_interval": ConfKey("seconds", DEFAULT_KEEP_ALIVE_INTERVAL_S),
    "keep_alive_max_attempt": ConfKey("attempts", DEFAULT_KEEP_ALIVE_MAX_ATTEMPT),
    "read_timeout": ConfKey("seconds", 60.0),
    "is_host": ConfKey("bool", None),
    "use_libuv": ConfKey("bool", None),
    "store_type": ConfKey("choice", "tcp", ("tcp", "file")),
    "protocol": ConfKey("choice", "http", ("http", "https")),
}


def _shown(raw: object) -> str:
    text = repr(str(raw)) if isinstance(raw, str) else repr(raw)
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 3]}..."


def parse_conf_value(key: str, raw: object) -> float | int | bool | str:
    """Parse one ``--rdzv-conf`` value of a key in :data:`CONF_TABLE`: the only parser of them.

    Args:
        key: the key (must be in the table).
        raw: the value as given (text from the command line, or a number or bool from Python).

    Returns:
        The value: seconds as a float, attempts as an int, a bool, or a choice in lower case.

    Raises:
        ConfigurationError: the value is not of the key's kind or out of its bounds (NaN,
            infinite, negative, zero where not allowed, more than a year, not a whole number).
    """
    spec = CONF_TABLE[key]
    what = f"--rdzv-conf {key}"
    text = str(raw).strip()
    if spec.kind in ("seconds", "seconds0"):
        try:
            value = float(text)
        except ValueError:
            raise ConfigurationError(f"{what} {_shown(raw)} is not a number of seconds") from None
        if not math.isfinite(value):
            raise ConfigurationError(f"{what} {text} is not a finite number of seconds")
        if value < 0 or (value == 0 and spec.kind == "seconds"):
            bound = "not be negative" if spec.kind == "seconds0" else "be positive"
            raise ConfigurationError(f"{what} {value:g} must {bound}")
        if value > MAX_DURATION_S:
            raise ConfigurationError(
                f"{what} {value:g} is more than a year ({MAX_DURATION_S:.0f} s), the longest "
                "duration the stores' clocks take"
            )
        return value
    if spec.kind == "attempts":
        if isinstance(raw, bool) or not (text.isascii() and text.isdigit()) or len(text) > 9:
            raise ConfigurationError(
                f"{what} {_shown(raw)} is not a whole number in 1..{MAX_KEEP_ALIVE_ATTEMPTS}"
            )
        count = int(text)
        if not 1 <= count <= MAX_KEEP_ALIVE_ATTEMPTS:
            raise ConfigurationError(
                f"{what} {count} is out of range (1..{MAX_KEEP_ALIVE_ATTEMPTS})"
            )
        return count
    if spec.kind == "bool":
        if isinstance(raw, bool):
            return raw
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigurationError(
            f"{what} {_shown(raw)} is not a boolean (1/0, true/false, t/f, yes/no, y/n)"
        )
    lowered = text.lower()
    if lowered not in spec.choices:
        raise ConfigurationError(f"{what} {_shown(raw)} must be {' or '.join(spec.choices)}")
    return lowered


def check_conf_values(config: Mapping[str, object]) -> dict[str, float | int | bool | str]:
    """Parse every key of ``config`` whose meaning is known; other keys pass untouched.

    Returns:
        The parsed values of the known keys given.

    Raises:
        ConfigurationError: a known key has a bad value (see :func:`parse_conf_value`).
    """
    return {
        key: parse_conf_value(key, raw)
        for key, raw in config.items()
        if key in CONF_TABLE and raw is not None
    }


def conf_seconds(
    params: RendezvousParameters, key: str, default: float, *, allow_zero: bool = False
) -> float:
    """Read ``key`` (a seconds key of :data:`CONF_TABLE`) with ``default`` when absent.

    ``allow_zero`` is kept for callers' clarity; the table decides whether 0 is allowed.

    Raises:
        ConfigurationError: the value is not such a number.
    """
    raw = params.config.get(key)
    if raw is None:
        return default
    return float(parse_conf_value(key, raw))


def check_conf_keys(
    params: RendezvousParameters, backend_keys: Iterable[str], backend: str
) -> tuple[str, ...]:
    """Warn (one line each kind) about keys this backend ignores; return them.

    Args:
        params: the parameters whose ``config`` to check.
        backend_keys: the keys the backend reads (beside :data:`HANDLER_KEYS`).
        backend: the backend's name, for the message.
    """
    used = HANDLER_KEYS | frozenset(backend_keys)
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


class RendezvousTimeout:
    """torch's timeouts of the dynamic rendezvous (``None``: the default of each).

    Args:
        join: how long a rendezvous may take (600 s).
        last_call: how long a round at min nodes waits for more (30 s).
        close: the bound on closing and leaving (30 s).
        heartbeat: the deadline of one heartbeat (5 s).

    Raises:
        ValueError: a timeout is not positive.
    """

    _DEFAULTS = {"join": 600.0, "last_call": 30.0, "close": 30.0, "heartbeat": 5.0}

    def __init__(
        self,
        join: timedelta | None = None,
        last_call: timedelta | None = None,
        close: timedelta | None = None,
        heartbeat: timedelta | None = None,
    ) -> None:
        given = {"join": join, "last_call": last_call, "close": close, "heartbeat": heartbeat}
        self._values: dict[str, timedelta] = {}
        for name, value in given.items():
            chosen = value if value is not None else timedelta(seconds=self._DEFAULTS[name])
            if chosen <= timedelta(0):
                raise ValueError(f"the {name} timeout ({chosen}) must be positive")
            self._values[name] = chosen

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


@dataclass(frozen=True)
class RendezvousSettings:
    """The timing of the dynamic rendezvous (torch's names, ``_s`` for seconds).

    Attributes:
        join_timeout_s: how long ``next_rendezvous`` may take.
        last_call_timeout_s: how long a round at min nodes waits for more.
        close_timeout_s: the bound on leaving (``shutdown``) and closing (``set_closed``).
        heartbeat_timeout_s: the deadline of one heartbeat write.
        keep_alive_interval_s: how often a node bumps its heartbeat.
        keep_alive_max_attempt: how many intervals without a move make a node gone; a reader
            also needs as many reads that found the counter unchanged (``protocol.Heartbeats``),
            so its own stall never convicts another node.
        read_timeout_s: how long one store call may take (the backends').
        is_host, use_libuv, store_type, protocol: the backends' switches (None: their default).
    """

    join_timeout_s: float = 600.0
    last_call_timeout_s: float = 30.0
    close_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 5.0
    keep_alive_interval_s: float = DEFAULT_KEEP_ALIVE_INTERVAL_S
    keep_alive_max_attempt: int = DEFAULT_KEEP_ALIVE_MAX_ATTEMPT
    read_timeout_s: float = 60.0
    is_host: bool | None = None
    use_libuv: bool | None = None
    store_type: str = "tcp"
    protocol: str = "http"

    def __post_init__(self) -> None:
        for name in ("join_timeout_s", "close_timeout_s", "heartbeat_timeout_s", "read_timeout_s"):
            _check_seconds(name, getattr(self, name), allow_zero=False)
        _check_seconds("keep_alive_interval_s", self.keep_alive_interval_s, allow_zero=False)
        _check_seconds("last_call_timeout_s", self.last_call_timeout_s, allow_zero=True)
        if not 1 <= self.keep_alive_max_attempt <= _MAX_ATTEMPTS:
            raise ConfigurationError(
                f"keep_alive_max_attempt must be in 1..{_MAX_ATTEMPTS}, "
                f"got {self.keep_alive_max_attempt}"
            )

    @property
    def stale_after_s(self) -> float:
        """How long a heartbeat may stand still before its node is judged gone."""
        return self.keep_alive_interval_s * self.keep_alive_max_attempt

    @classmethod
    def from_timeout(
        cls,
        timeout: RendezvousTimeout | None,
        keep_alive_interval_s: float,
        keep_alive_max_attempt: int,
    ) -> RendezvousSettings:
        """Settings from torch's ``RendezvousTimeout`` and keep-alive numbers."""
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
        cls, params: RendezvousParameters, backend_keys: Iterable[str] | None = None
    ) -> RendezvousSettings:
        """The settings of ``params.config``, parsed once; warn about keys nobody reads.

        The parse is kept with ``params`` while its config is unchanged: the registry's early
        check, the handler and the backends all get the same object.

        Args:
            params: the rendezvous parameters.
            backend_keys: the keys the backend reads itself; None to parse without warning
                about keys.

        Raises:
            ConfigurationError: a known key has a bad value.
        """
        if backend_keys is not None:
            check_conf_keys(params, backend_keys, params.backend)
        given = tuple(sorted((k, repr(v)) for k, v in params.config.items()))
        kept = _PARSED.get(params)
        if kept is not None and kept[0] == given:
            return kept[1]
        values = check_conf_values(params.config)

        def seconds(key: str, default: float | None = None) -> float:
            value = values.get(key, default if default is not None else CONF_TABLE[key].default)
            return float(value)  # type: ignore[arg-type]

        settings = cls(
            join_timeout_s=seconds("join_timeout", seconds("timeout", 600.0)),
            last_call_timeout_s=seconds("last_call_timeout"),
            close_timeout_s=seconds("close_timeout"),
            heartbeat_timeout_s=seconds("heartbeat_timeout"),
            keep_alive_interval_s=seconds("keep_alive_interval"),
            keep_alive_max_attempt=int(
                values.get("keep_alive_max_attempt", DEFAULT_KEEP_ALIVE_MAX_ATTEMPT)
            ),
            read_timeout_s=seconds("read_timeout"),
            is_host=_optional_bool(values.get("is_host")),
            use_libuv=_optional_bool(values.get("use_libuv")),
            store_type=str(values.get("store_type", "tcp")),
            protocol=str(values.get("protocol", "http")),
        )
        _PARSED[params] = (given, settings)
        return settings


_PARSED: weakref.WeakKeyDictionary[
    RendezvousParameters, tuple[tuple[tuple[str, str], ...], RendezvousSettings]
] = weakref.WeakKeyDictionary()


def _optional_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _check_seconds(name: str, value: float, *, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not math.isfinite(value) or not low_ok or value > MAX_DURATION_S:
        raise ConfigurationError(f"{name} must be a finite number of seconds in range, got {value}")
