"""The docs' flag reference (``docs/cli.md``), generated from the settings table.

One concept: render :data:`~elastic_run.agent.settings.table.SETTINGS` as the Markdown page a
user reads, one table per section, one line per setting: its flag and spellings, its variables
(``PET_<NAME>``, torch's), what it takes, its default, where its value goes and its help; then
the workers' environment and the logs' layout (prose kept here), and the ``status``, ``close``,
``report`` and ``etcd`` commands' options from their click commands.
``python -m elastic_run.cli.options.reference > docs/cli.md`` writes the page;
``tests/unit/test_settings_table.py`` fails when the committed page and the table disagree.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from elastic_run.agent.settings.setting import Setting
from elastic_run.agent.settings.table import SECTIONS, SETTINGS

__all__ = ["COMMAND", "render_reference"]

COMMAND = "python -m elastic_run.cli.options.reference > docs/cli.md"

_INTRO = f"""\
# CLI reference

<!-- Generated: the run command's flags from elastic_run/agent/settings/table.py, the other
     commands' from their click options, by `{COMMAND}`. Do not edit by hand:
     tests/unit/test_settings_table.py compares this page with what the table generates
     (the prose lives in elastic_run/cli/options/reference.py). -->

    elastic-run [OPTIONS] SCRIPT [SCRIPT_ARGS...]     run a job (the default command; also `elastic-run run`)
    elastic-run status --rdzv-id JOB ...              show a job's rendezvous
    elastic-run close --rdzv-id JOB ...               end a job
    elastic-run report LOG_DIR...                     a page of what happened to a job
    elastic-run etcd                                  run a local etcd for jobs

`python -m elastic_run` is the same program. Bad input is one line `Error: ...` and exit 2,
nothing started; the other exit codes are in [Exit codes](exit-codes.md).

## The run command

Every flag is torchrun's, with torchrun's spelling and default, or one of elastic-run's own.
Each is accepted with dashes and with underscores (`--nproc-per-node`, `--nproc_per_node`) and
also read from its `PET_<NAME>` variable (`PET_NPROC_PER_NODE`), as torchrun reads them. As with
torchrun (argparse), any unambiguous prefix of a flag works (`--redirect=3`, `--max_r 2`); a
prefix of several flags is an error naming them. `${{local_rank}}` in ARGS is replaced per worker.

Where a value comes from, highest first: the command line; its `PET_` variable; torch's own
variable, where torch reads one (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, ...); inside a Slurm
allocation, the allocation (`--rdzv-id`, `--nnodes`, `--rdzv-backend`, `--rdzv-endpoint`,
`--nproc-per-node`, for what the first two left open; see [Slurm](slurm.md)); the default.
`--print-config` prints every setting below with its effective value and where it came from
(`given`, `from PET_X`, `from TORCH_X`, the Slurm variable, a rule such as `--standalone`, or
`default`), and starts nothing.

Every value is checked before anything starts: a bad one (`0` where 0 is not a value, `-1`,
`abc`, `inf`, `nan`, a number too large) is one line `Error: ...` naming the flag or the variable
it came from, the same wording from either, and exit code 2. The rendezvous keys of
`--rdzv-conf` are in [Backends](backends.md#--rdzv-conf-keys).
"""

_AFTER_RUN = """\
### The workers' environment

Workers get torchrun's environment (`LOCAL_RANK`, `RANK`, `GROUP_RANK`, `ROLE_RANK`, `ROLE_NAME`,
`LOCAL_WORLD_SIZE`, `WORLD_SIZE`, `GROUP_WORLD_SIZE`, `ROLE_WORLD_SIZE`, `MASTER_ADDR`,
`MASTER_PORT`, `TORCHELASTIC_RESTART_COUNT`, `TORCHELASTIC_MAX_RESTARTS`, `TORCHELASTIC_RUN_ID`,
`TORCHELASTIC_USE_AGENT_STORE`, `TORCHELASTIC_ERROR_FILE`, `TORCH_NCCL_ASYNC_ERROR_HANDLING`,
`TORCHELASTIC_SIGNALS_TO_HANDLE` (the `--signals-to-handle` text), `OMP_NUM_THREADS=1` when more
than one worker per node and unset), so `init_process_group("gloo" or "nccl")` with `env://` just
works. `MASTER_ADDR:MASTER_PORT` is a TCPStore that node 0's agent hosts fresh for every round.

Every worker of a round sees the same `TORCHELASTIC_RESTART_COUNT`: the job's count of restarts,
kept in the round's seal, not each node's own (in torch a node that did not fail sees a smaller
count, so scripts that branch on it, "resume if restarted", can disagree across ranks).

They also get `ELASTIC_RUN_GUARDIAN`, a random token per agent: when the agent dies, even by
SIGKILL, its guardian process kills every process whose environment carries it (the workers'
children and grandchildren, also those in a session of their own), beside the workers' sessions.
A process started with an environment stripped of it is reached only through its session. And
`ELASTIC_RUN_PROGRESS_FILE`, `ELASTIC_RUN_PROGRESS_SLOT`, `ELASTIC_RUN_AUTO_PROGRESS` (the
progress beats, see [Hangs and stragglers](hangs-and-stragglers.md)).

Worker-side helpers (`elastic_run.worker`, which imports nothing of the agent): `@record` writes
the error file (torch's own `@record` works too), `expires(after=S, scope=NAME)` arms a watchdog
timer (torch's `FileTimerClient` works too), `progress(step)` and `sync_point()` (progress beats),
and typed access to the environment.

### Logs and console

As torchrun, every run gets its own directory, so a second run with the same `--rdzv-id` keeps
the first one's logs: `<log-dir>/<run-id>_<random>/attempt_<n>/<local-rank>/{stdout.log,
stderr.log,error.json,stacks.txt}`, and beside the attempts `events.jsonl`. Without `--log-dir`
the root is a fresh temporary directory, as torchrun's.

A worker's output passes through unchanged (stdout to stdout, stderr to stderr, no prefix:
`elastic-run ... | jq` works, and lines of different ranks are never cut into each other); teed
lines (`--tee`) carry torchrun's `[default0]:` prefix, or
`TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE` filled in (`${role_name}`, `${rank}`, `${local_rank}`).
The agent's own lines go to stderr. When the agent's environment has `TORCHELASTIC_ERROR_FILE`
(TorchX, a batch system), a failed job's root-cause error record is copied there, as torchrun
does; each worker keeps its own file.
"""

# The other commands: a line of use, and what follows their table.
_COMMANDS = (
    (
        "status",
        "elastic-run status --rdzv-endpoint node0:29400 --rdzv-id job42 [--json] [--watch]",
        "The JSON's fields: [Observability](observability.md#status-and-close).",
    ),
    (
        "close",
        "elastic-run close --rdzv-endpoint node0:29400 --rdzv-id job42 [--wait [--timeout S]]",
        "What a close does: [Observability](observability.md#status-and-close).",
    ),
    (
        "report",
        "elastic-run report LOG_DIR... [-o job.html] [--json] [--run-id JOB]",
        "What the page shows, and the JSON's fields: [Report](report.md).",
    ),
    (
        "etcd",
        "elastic-run etcd [--members 3]",
        "Runs etcd in the foreground until Ctrl-C, printing the `--rdzv-endpoint` to use.",
    ),
)


_CTX = click.Context(click.Command("elastic-run"))


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


def _click_row(option: click.Option) -> str:
    names = [n.strip() for n in (*option.opts, *option.secondary_opts) if n.strip()]
    flags = ", ".join(
        _code(n + ("" if option.is_flag else f" {option.make_metavar(_CTX)}"))
        if i == 0
        else _code(n)
        for i, n in enumerate(names)
    )
    variables = _code(option.envvar) if isinstance(option.envvar, str) else ""
    if option.is_flag:
        default = "off"
    elif option.default is None:
        default = ""
    else:
        default = _code(str(option.default))
    cells = (flags, variables, default, option.help or "")
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _command_section(name: str, usage: str, after: str) -> list[str]:
    from elastic_run.cli.main import cli

    command = cli.commands[name]
    options = [p for p in command.params if isinstance(p, click.Option)]
    return [
        f"## elastic-run {name}",
        "",
        f"    {usage}",
        "",
        "| Flag | Variable | Default | What it does |",
        "| --- | --- | --- | --- |",
        *(_click_row(option) for option in options),
        "",
        after,
        "",
    ]


def render_reference() -> str:
    """The whole page, Markdown, ending in a newline."""
    lines = [_INTRO]
    for section in SECTIONS:
        rows = [s for s in SETTINGS if s.section == section]
        if not rows:
            continue
        lines += [
            f"### {section}",
            "",
            "| Flag | Variables | Takes | Default | Goes to | What it does |",
            "| --- | --- | --- | --- | --- | --- |",
            *(_row(s) for s in rows),
            "",
        ]
    lines.append(_AFTER_RUN)
    for name, usage, after in _COMMANDS:
        lines += _command_section(name, usage, after)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_reference())
