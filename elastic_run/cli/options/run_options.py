"""The run command's click options, generated from the settings table.

One concept: how click reads ``elastic-run run``'s flags. Each row of
:data:`~elastic_run.agent.settings.table.SETTINGS` that has a flag becomes one click option,
accepted with dashes and with underscores (``--nproc-per-node``, ``--nproc_per_node``) and its
short alias (``-r``); an on/off setting also as ``--no-<flag>``. Help, placeholder, the
variables read (``PET_<NAME>``, torch's) and the default shown come from the row. click reads
only the command line and hands on the text as given (True for a bare flag): it reads no
variable and converts no value, so that every value,
from the command line, its ``PET_<NAME>`` variable, torch's variable or the Slurm allocation,
is read once by the row's parser in :mod:`elastic_run.cli.options.sources`, with one wording.
No default is written here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from elastic_run.agent.settings.setting import Setting
from elastic_run.agent.settings.table import SETTINGS

__all__ = ["click_option", "run_options"]


def _underscored(flag: str) -> str:
    return "--" + flag[2:].replace("-", "_")


def _help(setting: Setting[Any]) -> str:
    """The row's help, then its variables and its default, as click shows them."""
    extras = []
    variables = [v for v in (setting.pet_env, setting.torch_env) if v is not None]
    if variables:
        extras.append(f"env var: {', '.join(variables)}")
    shown = _default_shown(setting)
    if shown:
        extras.append(f"default: {shown}")
    return f"{setting.help}  [{'; '.join(extras)}]" if extras else setting.help


def _default_shown(setting: Setting[Any]) -> str:
    if setting.form == "flag":
        return ""
    if setting.form == "switch" and setting.default_text is None and setting.default is not None:
        assert setting.flag is not None and setting.off_flag is not None
        return (setting.flag if setting.default else setting.off_flag)[2:]
    return setting.default_shown


def click_option(setting: Setting[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of one row: its spellings, help, placeholder and the default shown.

    Args:
        setting: a row with a flag.

    Returns:
        The decorator that adds the option (parameter name: the row's name; value: the text
        given, True/False for a flag or a switch, None when not given).
    """
    assert setting.flag is not None, setting.name
    if setting.form == "switch":
        on, off = setting.flag, setting.off_flag
        assert off is not None
        names = [f"{on}/{off}"]
        if _underscored(on) != on:
            names.append(f"{_underscored(on)}/ ")
        if _underscored(off) != off:
            names.append(f" /{_underscored(off)}")
        return click.option(*names, setting.name, default=None, help=_help(setting))
    if setting.form == "flag":
        return click.option(
            *setting.spellings, setting.name, is_flag=True, default=None, help=_help(setting)
        )
    return click.option(
        *setting.spellings,
        setting.name,
        default=None,
        metavar=setting.metavar,
        help=_help(setting),
    )


def run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Attach one option per row with a flag to a click command, in the table's order.

    Args:
        fn: the command function.

    Returns:
        The function with the options attached.
    """
    for setting in reversed(SETTINGS):
        if setting.flag is not None:
            fn = click_option(setting)(fn)
    return fn
