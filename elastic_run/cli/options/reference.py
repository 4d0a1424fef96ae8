"""The docs' flag reference (``docs/cli.md``), generated from the settings table.

One concept: render :data:`~elastic_run.agent.settings.table.SETTINGS` as the Markdown page a
user reads, one table per section, one line per setting: its flag and spellings, its variables
(``PET_<NAME>``, torch's), what it takes, its default, where its value goes and its help.
``python -m elastic_run.cli.options.reference > docs/cli.md`` writes the page;
``tests/unit/test_settings_table.py`` fails when the committed page and the table disagree.
"""

from __future__ import annotations

import sys
from typing import Any

from elastic_run.agent.settings.setting import Setting
from elastic_run.agent.settings.table import SECTIONS, SETTINGS

__all__ = ["COMMAND", "render_reference"]

COMMAND = "python -m elastic_run.cli.options.reference > docs/cli.md"

_INTRO = f"""\
# Command-line reference: `elastic-run run`

<!-- Generated from elastic_run/agent/settings/table.py by `{COMMAND}`.
     Do not edit by hand: tests/unit/test_settings_table.py compares this page with the table. -->

```
elastic-run [OPTIONS] SCRIPT [ARGS]...        # the same as: elastic-run run [OPTIONS] SCRIPT ...
```

Every flag is torchrun's, with torchrun's spelling and default, or one of elastic-run's own.
Each is accepted with dashes and with underscores (`--nproc-per-node`, `--nproc_per_node`), by any
prefix that names one flag (`--nproc 2`, as argparse does), and also from its `PET_<NAME>`
variable (`PET_NPROC_PER_NODE=2`), as torchrun reads them. `${{local_rank}}` in ARGS is replaced
per worker.

Where a value comes from, highest first: the command line; its `PET_` variable; torch's own
variable, where torch reads one (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, ...); inside a Slurm
allocation, the allocation (`--rdzv-id`, `--nnodes`, `--rdzv-backend`, `--rdzv-endpoint`,
`--nproc-per-node`, for what the first two left open); the default. `--print-config` prints
every setting below with its effective value and where it came from, and starts nothing.

Every value is checked before anything starts: a bad one (`0`, `-1`, `abc`, `inf`, `nan`, a
number too large) is one line `Error: ...` naming the flag or the variable, and exit code 2.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _flags(setting: Setting[Any]) -> str:
    if setting.flag is None:
        return "(none: a variable only)"
    names = list(setting.spellings)
    if setting.off_flag is not None:
        off = setting.off_flag
        names += [off] + ([u] if (u := "--" + off[2:].replace("-", "_")) != off else [])
    if setting.form == "value":
        names[names.index(setting.flag)] = f"{setting.flag} {setting.metavar or 'VALUE'}"
    return ", ".join(_code(name) for name in names)


def _variables(setting: Setting[Any]) -> str:
    names = [n for n in (setting.pet_env, setting.torch_env) if n is not None]
    return ", ".join(_code(name) for name in names)


def _default(setting: Setting[Any]) -> str:
    if setting.form == "flag":
        return "off"
    shown = setting.default_shown
    if setting.default is None or setting.default_text is not None:
        return shown
    return _code(shown) if shown else '`""`'


def _row(setting: Setting[Any]) -> str:
    cells = (
        _flags(setting),
        _variables(setting),
        setting.kind.takes,
        _default(setting),
        "; ".join(place.describe() for place in setting.places),
        setting.help,
    )
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def render_reference() -> str:
    """The whole page, Markdown, ending in a newline."""
    lines = [_INTRO]
    for section in SECTIONS:
        rows = [s for s in SETTINGS if s.section == section]
        if not rows:
            continue
        lines += [
            f"## {section}",
            "",
            "| Flag | Variables | Takes | Default | Goes to | What it does |",
            "| --- | --- | --- | --- | --- | --- |",
            *(_row(s) for s in rows),
            "",
        ]
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_reference())
