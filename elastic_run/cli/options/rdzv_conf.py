"""The ``--rdzv-conf`` value: ``k1=v1,k2=v2`` parsed, and the keys whose meaning is known checked.

One concept, shared by ``run``, ``status`` and ``close``: the rendezvous configuration as the
user typed it. The pairs are passed on unchanged (the rendezvous reads them itself and checks
them again); this module only makes sure that a value the launcher would choke on later (a NaN
heartbeat interval, a timeout of 1e300 s that overflows ``timedelta``) is one ``Error:`` line
before anything starts. A key it does not know passes through untouched: backends and plugins
read keys of their own.

Known keys (torch's names):

    join_timeout, close_timeout, heartbeat_timeout,   seconds, finite, > 0, at most a year
    keep_alive_interval, read_timeout, timeout
    last_call_timeout                                 seconds, finite, >= 0, at most a year
    keep_alive_max_attempt                            a whole number 1..1000
    is_host, use_libuv                                torch's booleans (1/0, true/false, t/f,
                                                      yes/no, y/n, any case)
    store_type                                        tcp | file (any case)
    protocol                                          http | https (any case)
"""

from __future__ import annotations

from collections.abc import Iterable

from elastic_run.cli.options.values import check_count, parse_seconds, parse_torch_bool, shown
from elastic_run.errors import ConfigurationError

__all__ = [
    "MAX_KEEP_ALIVE_ATTEMPTS",
    "parse_rdzv_conf",
    "validate_rdzv_conf",
]

MAX_KEEP_ALIVE_ATTEMPTS = 1000

_POSITIVE_SECONDS = frozenset(
    {
        "join_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "read_timeout",
        "timeout",
    }
)
_ZERO_OK_SECONDS = frozenset({"last_call_timeout"})
_BOOLEANS = frozenset({"is_host", "use_libuv"})
_CHOICES: dict[str, tuple[str, ...]] = {
    "store_type": ("tcp", "file"),
    "protocol": ("http", "https"),
}


def parse_rdzv_conf(text: str) -> tuple[tuple[str, str], ...]:
    """Parse ``k1=v1,k2=v2`` into pairs (keys and values stripped; a repeated key: last wins).

    Args:
        text: the ``--rdzv-conf`` value; empty (or blank) gives no pairs.

    Returns:
        The pairs, in the order their keys first appear.

    Raises:
        ConfigurationError: an item is not ``key=value`` with a non-empty key.
    """
    conf: dict[str, str] = {}
    if not text.strip():
        return ()
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"--rdzv-conf {shown(text)}: expected key=value pairs, got {shown(item)}"
            )
        conf[key.strip()] = value.strip()
    return tuple(conf.items())


def _check_whole_number(key: str, value: str) -> None:
    what = f"--rdzv-conf {key}"
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise ConfigurationError(
            f"{what} {shown(value)} is not a whole number in 1..{MAX_KEEP_ALIVE_ATTEMPTS}"
        )
    check_count(int(text), what, 1, MAX_KEEP_ALIVE_ATTEMPTS)


def validate_rdzv_conf(conf: Iterable[tuple[str, str]]) -> None:
    """Check the value of every key whose meaning is known (see the module docstring).

    Args:
        conf: the pairs from :func:`parse_rdzv_conf`.

    Raises:
        ConfigurationError: a known key has a value the rendezvous could not use; the
            message names the key and the value. Unknown keys are never an error here.
    """
    for key, value in conf:
        what = f"--rdzv-conf {key}"
        if key in _POSITIVE_SECONDS or key in _ZERO_OK_SECONDS:
            parse_seconds(value, what, allow_zero=key in _ZERO_OK_SECONDS)
        elif key == "keep_alive_max_attempt":
            _check_whole_number(key, value)
        elif key in _BOOLEANS:
            parse_torch_bool(value, what)
        elif key in _CHOICES and value.strip().lower() not in _CHOICES[key]:
            choices = " or ".join(_CHOICES[key])
            raise ConfigurationError(f"{what} {shown(value)} must be {choices}")
