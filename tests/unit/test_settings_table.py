"""The settings table is the one source: its rows agree with torchrun's parser, with the click
options, the launch configuration, the objects their values go to and the docs' page, and no
default of a setting is written anywhere else in the package.

Nothing is started: click parses, the table's parsers read, ``ast`` reads the package's source.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from elastic_run.agent.api import WorkerSpec
from elastic_run.agent.config import AgentOptions, LaunchConfig
from elastic_run.agent.local import LocalElasticAgent
from elastic_run.agent.loop.simple import SimpleElasticAgent
from elastic_run.agent.progress.config import ProgressOptions
from elastic_run.agent.settings import table
from elastic_run.agent.settings.setting import Setting, Target
from elastic_run.agent.settings.table import DEFAULT_SIGNALS, SETTINGS
from elastic_run.cli.main import cli
from elastic_run.cli.options.launch_config import ParsedRun, parse_launch_config
from elastic_run.cli.options.reference import COMMAND, render_reference

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "elastic_run"
WITH_FLAG = [s for s in SETTINGS if s.flag is not None]


def _ids(settings: list[Setting[Any]]) -> list[str]:
    return [s.name for s in settings]


# ---- the rows themselves ----------------------------------------------------------------------


def test_every_setting_is_a_row_of_the_table_once() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    constants = [v for k, v in vars(table).items() if k.isupper() and isinstance(v, Setting)]
    assert {id(v) for v in constants} == {id(s) for s in SETTINGS}, "a row missing from SETTINGS"
    assert set(table.SECTIONS) == {s.section for s in SETTINGS}


@pytest.mark.parametrize("setting", WITH_FLAG, ids=_ids(WITH_FLAG))
def test_a_flag_is_its_name_with_dashes_and_its_variable_pet_name(setting: Setting[Any]) -> None:
    assert setting.flag == "--" + setting.name.replace("_", "-")
    assert setting.pet_env == "PET_" + setting.name.upper()
    assert setting.flag in setting.spellings
    assert ("--" + setting.name) in setting.spellings  # torchrun's underscore spelling


@pytest.mark.parametrize(
    "setting",
    [s for s in SETTINGS if s.default is not None and s.default_text is None],
    ids=_ids([s for s in SETTINGS if s.default is not None and s.default_text is None]),
)
def test_the_text_of_a_default_reads_back_as_the_default(setting: Setting[Any]) -> None:
    assert setting.parse(setting.show(setting.default), "X") == setting.default


def test_the_rows_keep_torchruns_flags_spellings_and_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.run import get_args_parser

    # torchrun's defaults read PET_* variables (the test session sets PET_LOG_DIR per test).
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    # argparse lists a parser's actions only in this attribute.
    actions = [a for a in get_args_parser()._actions if a.option_strings and a.dest != "help"]
    differ = {
        "master_port": "torchrun picks 29500 later; our default says it",
        "shutdown_timeout": "torchrun: None, then TORCH_ELASTIC_SHUTDOWN_TIMEOUT, then 30",
    }
    for action in actions:
        setting = table.by_name(action.dest)
        assert set(action.option_strings) <= set(setting.spellings), action.dest
        if action.dest in differ or action.default is None:
            assert action.dest in differ or setting.default is None, action.dest
            continue
        if isinstance(action.default, bool):
            assert setting.default is action.default, action.dest
        elif isinstance(action.default, list):
            assert setting.default == tuple(action.default), action.dest
        else:
            assert setting.parse(str(action.default), "X") == setting.default, action.dest


def test_one_definition_of_the_default_signals() -> None:
    assert DEFAULT_SIGNALS == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    assert table.SIGNALS_TO_HANDLE.default is DEFAULT_SIGNALS
    assert AgentOptions().signals is DEFAULT_SIGNALS
    signature = inspect.signature(SimpleElasticAgent.__init__)
    assert signature.parameters["signals"].default is DEFAULT_SIGNALS


# ---- where the values go --------------------------------------------------------------------

_TARGETS: dict[Target, Any] = {
    Target.WORKER_SPEC: WorkerSpec,
    Target.AGENT: LocalElasticAgent.__init__,
    Target.AGENT_OPTIONS: AgentOptions,
    Target.PROGRESS: ProgressOptions,
}
# Fields whose default at the target is not the row's, each with its reason.
_TARGET_DEFAULTS_DIFFER = {
    (Target.WORKER_SPEC, "max_restarts"): "torch's WorkerSpec has 3, torchrun's flag 0",
    (Target.WORKER_SPEC, "master_port"): "torch's WorkerSpec: None (the agent picks a port)",
    (Target.WORKER_SPEC, "master_addr"): "torch's WorkerSpec: None (the rendezvous's address)",
}


def _parameters(target: Target) -> dict[str, Any]:
    """name -> default (inspect.Parameter.empty when required) of the target's fields."""
    obj = _TARGETS[target]
    if dataclasses.is_dataclass(obj):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                out[f.name] = inspect.Parameter.empty
        return out
    return {n: p.default for n, p in inspect.signature(obj).parameters.items()}


def _places(target: Target) -> Iterator[tuple[Setting[Any], str]]:
    for setting in SETTINGS:
        for place in setting.places:
            if place.target is target:
                yield setting, place.field


@pytest.mark.parametrize("target", list(_TARGETS), ids=[t.name for t in _TARGETS])
def test_each_place_a_row_names_exists_with_the_rows_default(target: Target) -> None:
    parameters = _parameters(target)
    for setting, name in _places(target):
        assert name in parameters, f"{target.value} has no {name!r} ({setting.name})"
        assert setting.attribute is not None, setting.name
        default = parameters[name]
        if default is inspect.Parameter.empty or (target, name) in _TARGET_DEFAULTS_DIFFER:
            continue
        assert default == setting.default, (target.value, name, default, setting.default)


def test_the_launch_config_holds_one_attribute_per_row() -> None:
    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    attributes = {s.attribute for s in SETTINGS if s.attribute is not None}
    worked_out = {
        "entrypoint",
        "args",
        "min_nodes",
        "max_nodes",
        "extra_env",
        "base_env",
        "rdzv_conf",  # --rdzv-conf parsed once, for the rendezvous
        "node_devices",  # what --nproc-per-node asks, for the node check
    }
    assert fields == attributes | worked_out | {"python_exec"}
    for f in dataclasses.fields(LaunchConfig):
        if f.name in attributes:
            assert f.default is dataclasses.MISSING, f"{f.name}: a default outside the table"


def _parse(args: list[str], environ: dict[str, str] | None = None) -> ParsedRun:
    command = cli.commands["run"]
    ctx = command.make_context("run", args)
    given = {
        n
        for n in ctx.params
        if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE
    }
    return parse_launch_config(dict(ctx.params), given, environ or {})


def test_the_cli_hands_every_value_on_by_the_rows(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import json\n")
    parsed = _parse(
        [
            "--nproc-per-node=3",
            "--max-restarts=4",
            "--monitor-interval=0.25",
            "--role=trainer",
            "--master-addr=10.0.0.1",
            "--master-port=1234",
            "--local-addr=node7",
            "--start-method=fork",
            "--exit-barrier-timeout=7",
            "--shutdown-timeout=0",
            "--signals-to-handle=SIGTERM",
            "--watchdog",
            "--health-check-port=0",
            "--health-check-addr=0.0.0.0",
            "--health-check-timeout=9",
            "--duplicate-stdout-filters=a,,b",
            "--virtual-local-rank",
            "--no-warm-start",
            "--preload=json",
            "--hang-timeout=auto:12",
            "--straggler-factor=2.5",
            "--max-no-progress-restarts=3",
            "--no-auto-progress",
            "--script-exit-timeout=off",
            str(script),
        ],
        {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${rank}>", "TORCHELASTIC_TIMER_FILE": "/x"},
    )
    config = parsed.config
    assert config.arguments(Target.WORKER_SPEC) == {
        "local_world_size": 3,
        "max_restarts": 4,
        "monitor_interval": 0.25,
        "role": "trainer",
        "master_addr": "10.0.0.1",
        "master_port": 1234,
        "local_addr": "node7",
    }
    assert config.arguments(Target.AGENT) == {
        "start_method": "fork",
        "exit_barrier_timeout": 7.0,
        "shutdown_timeout": 0.0,
        "log_line_prefix_template": "<${rank}>",
    }
    options = config.agent_options()
    assert options.signals == (signal.SIGTERM,)
    assert options.watchdog and options.timer_file == "/x"
    assert (options.health_check_port, options.health_check_addr) == (0, "0.0.0.0")
    assert options.health_check_timeout_s == 9.0
    assert options.duplicate_stdout_filters == ("a,b",)
    assert options.virtual_local_rank and not options.warm_start and options.preload == ("json",)
    assert options.extra_env == (("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM"),)
    progress = options.progress
    assert (progress.hang.mode, progress.hang.timeout_s) == ("auto", 12.0)
    assert progress.straggler_factor == 2.5 and progress.max_no_progress_restarts == 3
    assert not progress.auto_progress and progress.script_exit_timeout_s is None
    # The objects accept what they are handed (a WorkerSpec needs a handler: any object here).
    WorkerSpec(rdzv_handler=object(), entrypoint="x", **config.arguments(Target.WORKER_SPEC))


def test_defaults_reach_the_objects_unchanged(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import json\n")
    config = _parse([str(script)]).config
    assert config.agent_options() == AgentOptions(
        extra_env=config.extra_env, warm_start=config.warm_start
    )
    agent_defaults = _parameters(Target.AGENT)
    for name, value in config.arguments(Target.AGENT).items():
        assert value == agent_defaults[name], name


# ---- generated from the table: the click options and the docs ----------------------------------


@pytest.mark.parametrize("setting", WITH_FLAG, ids=_ids(WITH_FLAG))
def test_each_row_with_a_flag_is_one_click_option(setting: Setting[Any]) -> None:
    (option,) = [p for p in cli.commands["run"].params if p.name == setting.name]
    assert isinstance(option, click.Option)
    names = {n.strip() for n in (*option.opts, *option.secondary_opts) if n.strip()}
    expected = set(setting.spellings)
    if setting.off_flag is not None:
        expected |= {setting.off_flag, "--" + setting.off_flag[2:].replace("-", "_")}
    assert names == expected
    assert option.default is None and option.envvar is None  # the table's sources read them
    assert option.help is not None and option.help.startswith(setting.help)


def test_the_run_command_has_no_option_the_table_lacks() -> None:
    options = {p.name for p in cli.commands["run"].params if isinstance(p, click.Option)}
    assert options == {s.name for s in WITH_FLAG}


def test_docs_cli_md_is_the_page_the_table_generates() -> None:
    page = ROOT / "docs" / "cli.md"
    assert page.read_text() == render_reference(), f"docs/cli.md is stale: run `{COMMAND}`"
    for setting in SETTINGS:
        assert f"`{setting.flag or setting.torch_env}" in page.read_text(), setting.name


# ---- no default written twice -------------------------------------------------------------------


def _setting_names() -> set[str]:
    names: set[str] = set()
    for setting in SETTINGS:
        names |= {setting.name, setting.name + "_s"}
        names |= {p.field for p in setting.places if p.target in _TARGETS}
    return names


def _is_literal(node: ast.expr | None) -> bool:
    """A default written as a value (``300``, ``"spawn"``, ``(signal.SIGTERM, ...)``,
    ``field(default=0)``), not a reference; None (absence) is not a setting's value."""
    if node is None:
        return False
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_literal(e) or isinstance(e, ast.Attribute) for e in node.elts)
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("field", "dataclasses.field"):
        return any(k.arg == "default" and _is_literal(k.value) for k in node.keywords)
    return False


def _parameter_defaults(
    node: ast.FunctionDef | ast.AsyncFunctionDef,
) -> list[tuple[str, ast.expr | None]]:
    args = node.args
    positional = args.posonlyargs + args.args
    with_default = positional[len(positional) - len(args.defaults) :]
    pairs = [(a.arg, d) for a, d in zip(with_default, args.defaults, strict=True)]
    return pairs + [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]


def _field_defaults(node: ast.ClassDef) -> list[tuple[str, ast.expr | None]]:
    return [
        (stmt.target.id, stmt.value)
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    ]


def _click_option_default(node: ast.Call) -> list[tuple[str, ast.expr | None]]:
    """(parameter name, default) of a ``click.option("--a-b", ..., default=...)`` call."""
    if not ast.unparse(node.func).endswith("click.option"):
        return []
    flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    names = {flag.strip(" -").split("/")[0].replace("-", "_") for flag in flags}
    return [(n, k.value) for k in node.keywords if k.arg == "default" for n in sorted(names)]


def literal_defaults(source: str, names: set[str]) -> list[tuple[str, str, str]]:
    """(qualified name, parameter or field, the literal) for each function parameter, dataclass
    field and click option of ``names`` whose default is written as a literal in ``source``."""
    found: list[tuple[str, str, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = prefix
            defaults: list[tuple[str, ast.expr | None]] = []
            if isinstance(child, ast.ClassDef):
                inner = prefix + child.name
                defaults = _field_defaults(child)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = prefix + child.name
                defaults = _parameter_defaults(child)
            elif isinstance(child, ast.Call):
                defaults = _click_option_default(child)
            where = inner or "<module>"
            found.extend(
                (where, name, ast.unparse(value))
                for name, value in defaults
                if name in names and value is not None and _is_literal(value)
            )
            visit(child, inner + "." if inner != prefix else prefix)

    visit(ast.parse(source), "")
    return found


# Literal defaults of a setting's name that stay, each with its reason. Every other one is a
# second copy of a default the table holds: reference the row (``settings.X.default``) instead.
_KEPT = {
    ("elastic_run/agent/api.py", "WorkerSpec", "max_restarts"): (
        "torch's WorkerSpec default (3); torchrun's --max-restarts default is 0: two defaults "
        "by torch's design (tests/compat/test_signatures.py holds 3)"
    ),
    ("elastic_run/agent/progress/config.py", "ProgressOptions", "max_no_progress_restarts"): (
        "ProgressOptions is the home of the progress settings' defaults: the table reads them "
        "from it (the table imports this module for its parsers, so it cannot import the table)"
    ),
    ("elastic_run/agent/progress/config.py", "ProgressOptions", "auto_progress"): (
        "the home of the default, as above"
    ),
    ("elastic_run/agent/progress/config.py", "ProgressOptions.parse", "script_exit_timeout"): (
        "the older parse entry point's text defaults (the CLI reads the rows now); the lead's "
        "file: drop them, or the method, when it is next touched"
    ),
    ("elastic_run/agent/progress/config.py", "ProgressOptions.parse", "auto_progress"): (
        "as above"
    ),
    ("elastic_run/agent/loop/simple.py", "SimpleElasticAgent.get_worker_group", "role"): (
        "torch's method signature in the lead's file (only the constructor's keyword defaults "
        "were moved to the table here): make it settings.ROLE.default"
    ),
    ("elastic_run/agent/loop/simple.py", "SimpleElasticAgent.run", "role"): "as above",
    ("elastic_run/agent/rules/observation.py", "ProgressView", "max_no_progress_restarts"): (
        "a pure observation record's zero for tests' brevity, not a setting's default"
    ),
    ("elastic_run/agent/rules/observation.py", "ProgressView", "straggler_factor"): (
        "as above (0.0: unknown)"
    ),
    ("elastic_run/agent/rules/observation.py", "Observation", "max_restarts"): "as above",
    (
        "elastic_run/rendezvous/dynamic/handler.py",
        "DynamicRendezvousHandler.set_local_info",
        "role",
    ): ("the rendezvous sits below the agent and cannot import its table; torch's role name"),
    ("elastic_run/rendezvous/protocol/records.py", "NodeRecord", "role"): (
        "a store record's field: the value a record without one reads as (wire format)"
    ),
}


def _sites() -> list[tuple[str, str, str, str]]:
    names = _setting_names()
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "elastic_run/agent/settings/table.py":
            continue  # the table: where the defaults are written, once
        for qualname, name, literal in literal_defaults(path.read_text(), names):
            out.append((rel, qualname, name, literal))
    return out


def test_no_default_of_a_setting_is_written_outside_the_table() -> None:
    sites = _sites()
    unexpected = [s for s in sites if s[:3] not in _KEPT]
    assert not unexpected, (
        "a setting's default written as a literal outside the settings table (reference the "
        "row's default, settings.<ROW>.default, or say why in _KEPT): "
        + "; ".join(f"{p}: {q}({n}={v})" for p, q, n, v in unexpected)
    )
    stale = sorted(set(_KEPT) - {s[:3] for s in sites})
    assert not stale, f"_KEPT names sites that no longer hold a literal: {stale}"


@pytest.mark.parametrize(
    "planted",
    [
        "def f(exit_barrier_timeout: float = 300.0) -> None: ...",
        "class C:\n    def __init__(self, *, shutdown_timeout_s: float = 30) -> None: ...",
        "import dataclasses\n@dataclasses.dataclass\nclass O:\n    health_check_timeout_s: float = 60.0",
        "class O:\n    signals: tuple = (signal.SIGTERM, signal.SIGINT)",
        "class O:\n    preload: tuple = field(default=())",
        "import click\nopt = click.option('--nnodes', default='1:1')",
        "def f(monitor_interval=-0.1): ...",
    ],
)
def test_the_scan_finds_a_planted_duplicate(planted: str) -> None:
    assert literal_defaults(planted, _setting_names()), planted


@pytest.mark.parametrize(
    "clean",
    [
        "def f(exit_barrier_timeout: float = settings.EXIT_BARRIER_TIMEOUT.default) -> None: ...",
        "def f(log_dir: str | None = None) -> None: ...",
        "class O:\n    signals: tuple = DEFAULT_SIGNALS",
        "def f(timeout_s: float = 300.0) -> None: ...",  # not a setting's name
    ],
)
def test_the_scan_lets_references_and_absence_pass(clean: str) -> None:
    assert not literal_defaults(clean, _setting_names()), clean


def test_print_config_lists_every_setting_its_value_and_where_it_came_from(tmp_path: Path) -> None:
    from elastic_run.cli.slurm.allocation import format_print_config

    script = tmp_path / "train.py"
    script.write_text("import json\n")
    parsed = _parse(
        ["--max-restarts", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", str(script)],
        {"PET_MONITOR_INTERVAL": "0.5", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"},
    )
    rows = {name: (value, source) for name, value, source in parsed.chosen}
    assert set(rows) == {s.name for s in SETTINGS}
    assert rows["max_restarts"] == ("2", "given")
    assert rows["monitor_interval"] == ("0.5", "from PET_MONITOR_INTERVAL")
    assert rows["shutdown_timeout"] == ("7", "from TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    assert rows["exit_barrier_timeout"] == ("300", "default")
    assert rows["warm_start"][1].startswith("default: off")
    text = format_print_config(parsed.chosen)
    assert all(f"  {s.name} " in text for s in SETTINGS), text
