"""Rendezvous settings: ``--rdzv-conf`` parsed once, at the edge, into one frozen object.

Every key is read here and nowhere else; the handler, the coordinator, the heartbeat thread
and the backends get the parsed numbers. Each backend declares the keys it reads itself
(``CONF_KEYS`` in its module); the handler's own keys are :data:`HANDLER_KEYS`.

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
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters

__all__ = [
    "DEFAULT_KEEP_ALIVE_INTERVAL_S",
    "DEFAULT_KEEP_ALIVE_MAX_ATTEMPT",
    "HANDLER_KEYS",
    "RendezvousTimeout",
    "MAX_DURATION_S",
    "TORCH_KEYS",
    "RendezvousSettings",
    "check_conf_keys",
    "conf_seconds",
]

log = logging.getLogger(__name__)

MAX_DURATION_S = 365 * 24 * 3600.0
_MAX_ATTEMPTS = 1000
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


def conf_seconds(
    params: RendezvousParameters, key: str, default: float, *, allow_zero: bool = False
) -> float:
    """Read ``key`` as a duration in seconds: finite, positive (or 0), at most a year.

    Raises:
        ConfigurationError: the value is not such a number.
    """
    raw = params.config.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(f"--rdzv-conf {key}={raw!r} is not a number of seconds") from None
    low_ok = value >= 0 if allow_zero else value > 0
    if not math.isfinite(value) or not low_ok or value > MAX_DURATION_S:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(
            f"--rdzv-conf {key}={raw!r} must be a finite number of seconds {bound} "
            f"and at most {MAX_DURATION_S:.0f}"
        )
    return value


def _conf_attempts(params: RendezvousParameters, key: str, default: int) -> int:
    raw = params.config.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigurationError(f"--rdzv-conf {key}={raw!r} is not an integer") from None
    if not 1 <= value <= _MAX_ATTEMPTS:
        raise ConfigurationError(f"--rdzv-conf {key}={raw!r} must be in 1..{_MAX_ATTEMPTS}")
    return value


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
    """

    join_timeout_s: float = 600.0
    last_call_timeout_s: float = 30.0
    close_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 5.0
    keep_alive_interval_s: float = DEFAULT_KEEP_ALIVE_INTERVAL_S
    keep_alive_max_attempt: int = DEFAULT_KEEP_ALIVE_MAX_ATTEMPT

    def __post_init__(self) -> None:
        for name in ("join_timeout_s", "close_timeout_s", "heartbeat_timeout_s"):
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
        """Parse the handler's keys of ``params.config``; warn about keys nobody reads.

        Args:
            params: the rendezvous parameters.
            backend_keys: the keys the backend reads itself (not parsed here); None to check
                the values only, without warning about keys.

        Raises:
            ConfigurationError: a handler key has a bad value.
        """
        if backend_keys is not None:
            check_conf_keys(params, backend_keys, params.backend)
        join = conf_seconds(params, "timeout", 600.0)
        return cls(
            join_timeout_s=conf_seconds(params, "join_timeout", join),
            last_call_timeout_s=conf_seconds(params, "last_call_timeout", 30.0, allow_zero=True),
            close_timeout_s=conf_seconds(params, "close_timeout", 30.0),
            heartbeat_timeout_s=conf_seconds(params, "heartbeat_timeout", 5.0),
            keep_alive_interval_s=conf_seconds(
                params, "keep_alive_interval", DEFAULT_KEEP_ALIVE_INTERVAL_S
            ),
            keep_alive_max_attempt=_conf_attempts(
                params, "keep_alive_max_attempt", DEFAULT_KEEP_ALIVE_MAX_ATTEMPT
            ),
        )


def _check_seconds(name: str, value: float, *, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not math.isfinite(value) or not low_ok or value > MAX_DURATION_S:
        raise ConfigurationError(f"{name} must be a finite number of seconds in range, got {value}")
