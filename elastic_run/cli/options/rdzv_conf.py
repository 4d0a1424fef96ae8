"""The ``--rdzv-conf`` value: ``k1=v1,k2=v2`` split, then parsed once by the rendezvous.

One concept, shared by ``run``, ``status`` and ``close``: the rendezvous configuration as the
user typed it. The values of the keys whose meaning is known are parsed here, before anything
starts, by the rendezvous's own parser over its one table of kinds, bounds and defaults
(:data:`elastic_run.rendezvous.settings.CONF_TABLE`): a NaN heartbeat interval or a timeout of
1e300 s is one ``Error:`` line. The result (a ``RendezvousConf``: the pairs as given and their
parse) is what the rendezvous gets (``RendezvousParameters.from_conf``): nothing parses it
again. A key it does not know passes through untouched: backends and plugins read keys of their
own.

Only the keys the chosen backend reads are parsed (torchrun's rule: each backend reads the keys
it knows): ``--rdzv-backend c10d --rdzv-conf timeout=5'`` is accepted, as torchrun accepts it,
because neither torch's c10d handler nor ours reads ``timeout`` (one warning line says so);
with the static backend, which reads it, ``5'`` is an error on both.
"""

from __future__ import annotations

from collections.abc import Iterable

from elastic_run.agent.settings.values import shown
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import RendezvousConf

__all__ = [
    "parse_rdzv_conf",
    "validate_rdzv_conf",
]


def parse_rdzv_conf(text: str) -> tuple[tuple[str, str], ...]:
    """Parse ``k1=v1,k2=v2`` into pairs (keys and values stripped; a repeated key: last wins),
    as torch's launcher splits it (quotes are characters like any other).

    Args:
        text: the ``--rdzv-conf`` value; empty (or blank) gives no pairs.

    Returns:
        The pairs, in the order their keys first appear.

    Raises:
        ConfigurationError: an item is not ``key=value`` with a non-empty key and value.
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
        if not value.strip():  # torch's parse refuses it too (ValueError)
            raise ConfigurationError(
                f"--rdzv-conf {shown(text)}: {shown(key.strip())} has no value"
            )
        conf[key.strip()] = value.strip()
    return tuple(conf.items())


def validate_rdzv_conf(
    conf: Iterable[tuple[str, str]], backend: str | None = None
) -> RendezvousConf:
    """Parse the value of every key whose meaning is known: the one parse (module docstring).

    Args:
        conf: the pairs from :func:`parse_rdzv_conf`.
        backend: the rendezvous backend: only the keys it reads are parsed (torchrun's rule:
            each backend reads the keys it knows, so ``timeout=5'`` for c10d, which never reads
            ``timeout``, is no error); None: every key of the table.

    Returns:
        The conf: the pairs as given, the parsed values of the known keys (``values``: seconds
        as floats, attempts as ints, bools, choices in lower case; unknown keys left out, as
        the rendezvous reads them itself) and the settings they make.

    Raises:
        ConfigurationError: a known key has a value the rendezvous could not use; the
            message names the key and the value. Unknown keys are never an error here.
    """
    return RendezvousConf.parse(conf, backend)
