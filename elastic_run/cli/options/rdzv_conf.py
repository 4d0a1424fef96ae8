"""The ``--rdzv-conf`` value: ``k1=v1,k2=v2`` parsed, and the keys whose meaning is known checked.

One concept, shared by ``run``, ``status`` and ``close``: the rendezvous configuration as the
user typed it. The pairs are passed on unchanged in ``RendezvousParameters``; the values of the
keys whose meaning is known are checked here, before anything starts, by the rendezvous's own
parser over its one table of kinds, bounds and defaults
(:data:`elastic_run.rendezvous.settings.CONF_TABLE`): a NaN heartbeat interval or a timeout of
1e300 s is one ``Error:`` line. A key it does not know passes through untouched: backends and
plugins read keys of their own.
"""

from __future__ import annotations

from collections.abc import Iterable

from elastic_run.agent.settings.values import shown
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import check_conf_values

__all__ = [
    "parse_rdzv_conf",
    "validate_rdzv_conf",
]


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


def validate_rdzv_conf(conf: Iterable[tuple[str, str]]) -> dict[str, float | int | bool | str]:
    """Check the value of every key whose meaning is known (see the module docstring).

    Args:
        conf: the pairs from :func:`parse_rdzv_conf`.

    Returns:
        The parsed values of the known keys given (seconds as floats, attempts as ints, bools,
        choices in lower case); unknown keys are left out, as the rendezvous reads them itself.

    Raises:
        ConfigurationError: a known key has a value the rendezvous could not use; the
            message names the key and the value. Unknown keys are never an error here.
    """
    return check_conf_values(dict(conf))
