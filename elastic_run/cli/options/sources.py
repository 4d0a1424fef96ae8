"""Where each setting's value comes from, and the value: every row of the settings table read
once, from the first source that gives it.

One concept: precedence, for every row of :data:`~elastic_run.agent.settings.table.SETTINGS`
alike, highest first:

1. the command line (``given``: click hands on the text as typed);
2. the row's ``PET_<NAME>`` variable (torchrun reads every flag from one; empty is unset);
3. torch's own variable for it, where torch reads one (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``...;
   blank is unset);
4. the Slurm allocation the command runs in, for the gaps the first two left (``rdzv_id``,
   ``nnodes``, ``rdzv_backend``, ``rdzv_endpoint``, ``nproc_per_node``; see
   :func:`elastic_run.cli.slurm.allocation.slurm_defaults`);
5. the row's default.

Each text is parsed by its row's parser, once, and a bad one is one ``ConfigurationError`` line
that names where the text came from (the flag, the variable) and the value, whatever the source.
The result keeps, for ``--print-config``, where each value came from: ``given``, ``from
PET_X``, ``from TORCH_X``, the Slurm reason, or ``default``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_run.agent.settings.setting import Setting
from elastic_run.agent.settings.table import ELASTIC_MIN, SETTINGS, by_name

__all__ = ["DEFAULT", "GIVEN", "Readings", "read_settings"]

GIVEN = "given"
DEFAULT = "default"

# The settings a Slurm allocation may fill in (see slurm_defaults), when neither the command
# line nor a PET_ variable gave them.
_FROM_SLURM = ("rdzv_id", "rdzv_backend", "rdzv_endpoint", "nproc_per_node", "nnodes")


@dataclass(frozen=True)
class _Text:
    """A setting's text as one source gave it."""

    text: str | bool  # a bare flag or switch on the command line is True/False
    source: str  # for --print-config: given, from PET_X, from TORCH_X, a Slurm reason
    what: str  # for a message: the flag, or the variable
    torch_env: bool = False


@dataclass(frozen=True)
class Readings:
    """Every setting's value, where it came from, and the text it was read from.

    Attributes:
        values: the parsed value of every setting, by name.
        sources: where each came from (``given``, ``from PET_X``, ..., ``default``).
        texts: the text each was read from (None: the default).
        given: the names the command line or a variable gave (not a default, not Slurm).
        notices: lines to print before the job starts (from the Slurm allocation).
    """

    values: Mapping[str, Any]
    sources: Mapping[str, str]
    texts: Mapping[str, str | None]
    given: frozenset[str]
    notices: tuple[str, ...]


def _text(
    setting: Setting[Any], params: Mapping[str, Any], given: set[str], environ: Mapping[str, str]
) -> _Text | None:
    """The first of command line, ``PET_`` variable and torch's variable that gives a text."""
    value = params.get(setting.name)
    if setting.flag is not None and setting.name in given and value is not None:
        return _Text(value if isinstance(value, bool) else str(value), GIVEN, setting.flag)
    if setting.pet_env is not None and environ.get(setting.pet_env):  # empty: unset, as click
        return _Text(environ[setting.pet_env], f"from {setting.pet_env}", setting.pet_env)
    torch_env = setting.torch_env
    if torch_env is not None and environ.get(torch_env, "").strip():  # blank: unset
        return _Text(environ[torch_env], f"from {torch_env}", torch_env, torch_env=True)
    return None


def _parse(setting: Setting[Any], text: _Text) -> Any:
    if isinstance(text.text, bool):
        return text.text
    return setting.parse(text.text, text.what, torch_env=text.torch_env)


def read_settings(
    params: Mapping[str, Any], given: set[str], environ: Mapping[str, str]
) -> Readings:
    """Read every setting from its sources (see the module docstring).

    Args:
        params: click's values by name (the text given, True/False for a flag, None).
        given: the names set on the command line.
        environ: the environment (the ``PET_`` and torch variables, the Slurm allocation).

    Returns:
        The readings.

    Raises:
        ConfigurationError: a text is not a value of its setting, or a Slurm variable is
            malformed (one line).
    """
    from elastic_run.cli.slurm.allocation import slurm_defaults

    texts = {s.name: _text(s, params, given, environ) for s in SETTINGS}
    user_given = frozenset(name for name, text in texts.items() if text is not None)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    elastic_min_text = texts[ELASTIC_MIN.name]  # first: the Slurm defaults depend on it
    if elastic_min_text is not None:
        values[ELASTIC_MIN.name] = _parse(ELASTIC_MIN, elastic_min_text)
    user = {name: t.text for name in _FROM_SLURM if (t := texts[name]) is not None}
    notices: list[str] = []
    elastic_min = values.get(ELASTIC_MIN.name)
    for default in slurm_defaults(environ, given=user, elastic_min=elastic_min):
        texts[default.name] = _Text(default.value, default.reason, str(by_name(default.name).flag))
        if default.notice:
            notices.append(default.notice)
    for setting in SETTINGS:
        text = texts[setting.name]
        if text is None:
            values[setting.name], sources[setting.name] = setting.default, DEFAULT
            continue
        if setting.name not in values:
            values[setting.name] = _parse(setting, text)
        sources[setting.name] = text.source
    raw = {
        name: (None if t is None else t.text if isinstance(t.text, str) else str(t.text))
        for name, t in texts.items()
    }
    return Readings(values, sources, raw, user_given, tuple(notices))
