"""The checks of what the workers will run (script, --no-python program, -m module), and
parse_launch_config as a whole: click's values in, a LaunchConfig or one ConfigurationError out.

Files and packages are made in a temporary directory; nothing is started.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import pytest

from elastic_run.cli.main import cli
from elastic_run.cli.options.entrypoint import check_entrypoint, find_module
from elastic_run.cli.options.launch_config import ParsedRun, parse_launch_config
from elastic_run.errors import ConfigurationError


def _check(entrypoint: str, cwd: Path, *, module: bool = False, no_python: bool = False) -> None:
    environ = {"PATH": os.environ.get("PATH", os.defpath)}
    check_entrypoint(entrypoint, module=module, no_python=no_python, cwd=cwd, environ=environ)


@pytest.fixture(name="tree")
def tree_fixture(tmp_path: Path) -> Path:
    """A directory with a script, programs, and packages of every kind."""
    (tmp_path / "train.py").write_text("print('train')\n")
    program = tmp_path / "prog.sh"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    (tmp_path / "plain.sh").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "plain.sh").chmod(0o644)
    (tmp_path / "mod_er_one.py").write_text("print('no import while checking')\n")
    runnable = tmp_path / "pkg_er_one"
    runnable.mkdir()
    (runnable / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (runnable / "__main__.py").write_text("")
    (runnable / "sub.py").write_text("")
    library = tmp_path / "lib_er_one"
    library.mkdir()
    (library / "__init__.py").write_text("")
    broken = tmp_path / "broken_er_one"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "ns_er_one" / "inner").mkdir(parents=True)
    (tmp_path / "ns_er_one" / "inner" / "__main__.py").write_text("")
    return tmp_path


def test_a_script_must_be_a_file(tree: Path) -> None:
    _check("train.py", tree)
    _check(str(tree / "train.py"), Path("/"))
    for missing in ("nope.py", ".", "x" * 5000):
        with pytest.raises(ConfigurationError, match="does not exist"):
            _check(missing, tree)


def test_a_program_must_be_executable_or_on_path(tree: Path) -> None:
    _check("./prog.sh", tree, no_python=True)
    _check("sh", tree, no_python=True)  # found on PATH
    with pytest.raises(ConfigurationError, match="not executable"):
        _check("./plain.sh", tree, no_python=True)
    with pytest.raises(ConfigurationError, match="does not exist"):
        _check("./nope.sh", tree, no_python=True)
    with pytest.raises(ConfigurationError, match="not on PATH"):
        _check("prog.sh", tree, no_python=True)  # exec looks on PATH, not here


def test_module_and_no_python_together_is_an_error(tree: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot be used together"):
        _check("train", tree, module=True, no_python=True)


def test_modules_are_found_without_importing_them(tree: Path) -> None:
    before = set(sys.modules)
    path_before = list(sys.path)
    for name in ("mod_er_one", "pkg_er_one", "pkg_er_one.sub", "ns_er_one.inner", "json.tool"):
        assert find_module(name, tree) is None, name
    assert not {m for m in set(sys.modules) - before if "er_one" in m and m != "ns_er_one"}
    assert sys.path == path_before


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("no_such_module_er", "no module named 'no_such_module_er'"),
        ("lib_er_one.nope", "no module named 'lib_er_one.nope'"),
        # python -m imports the parent first: its error is the reason
        ("pkg_er_one.nope", "RuntimeError: must not be imported"),
        ("mod_er_one.py", "'mod_er_one' is a module, not a package"),
        ("mod_er_one.py", "without .py: -m mod_er_one"),
        ("lib_er_one", "a package without a __main__"),
        ("broken_er_one.x", "RuntimeError: boom"),
        ("a..b", "not a module name"),
        (".rel", "not a module name"),
        ("dir/mod", "not a module name"),
        ("", "not a module name"),
    ],
)
def test_a_module_that_cannot_run_is_named_with_the_reason(
    tree: Path, name: str, words: str
) -> None:
    reason = find_module(name, tree)
    assert reason is not None and words in reason


def test_the_current_directory_counts_only_as_python_m_counts_it(tree: Path) -> None:
    assert find_module("mod_er_one", None) is not None  # PYTHONSAFEPATH: not on sys.path
    with pytest.raises(ConfigurationError, match="-m 'mod_er_one'"):
        check_entrypoint(
            "mod_er_one", module=True, no_python=False, cwd=tree, environ={"PYTHONSAFEPATH": "1"}
        )
    # Another interpreter's modules are not ours to see: no verdict.
    check_entrypoint(
        "not_here_er", module=True, no_python=False, cwd=tree, environ={"PYTHON_EXEC": "/x/py"}
    )


# ---- parse_launch_config ----------------------------------------------------------------


def _parse(args: list[str], environ: dict[str, str] | None = None) -> ParsedRun:
    command = cli.commands["run"]
    ctx = command.make_context("run", args)
    given = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    explicit = {name for name in ctx.params if ctx.get_parameter_source(name) in given}
    return parse_launch_config(dict(ctx.params), explicit, environ or {})


def test_a_good_command_line_becomes_a_config(tree: Path) -> None:
    parsed = _parse(
        [
            "--nnodes",
            "1:3",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:0",
            "--rdzv-id",
            "../job 1",
            "--rdzv-conf",
            "join_timeout=5,custom=x",
            "--monitor-interval",
            "0.5",
            str(tree / "train.py"),
            "--lr",
            "3",
        ]
    )
    config = parsed.config
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 3, 2)
    assert config.run_id == ".._job_1"
    assert config.rdzv_configs == (("join_timeout", "5"), ("custom", "x"))
    assert config.args == ("--lr", "3")
    assert config.monitor_interval_s == 0.5
    assert config.shutdown_timeout_s == 30.0
    assert ("rdzv_id", ".._job_1", "'../job 1' made safe for a path") in parsed.chosen
    assert any("is not safe in a file path" in n for n in parsed.notices)


def test_the_environment_is_read_and_checked(tree: Path) -> None:
    script = str(tree / "train.py")
    parsed = _parse([script], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7", "OMP_NUM_THREADS": "2"})
    assert parsed.config.shutdown_timeout_s == 7.0
    for env, words in (
        ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "nan"}, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT nan"),
        ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}, "not a number of seconds"),
        ({"TORCHELASTIC_HEALTH_CHECK_PORT": "70000"}, "out of range (0..65535)"),
        ({"TORCHELASTIC_HEALTH_CHECK_PORT": "http"}, "not a whole number"),
    ):
        with pytest.raises(ConfigurationError) as caught:
            _parse([script], env)
        assert words in str(caught.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--monitor-interval", "nan"], "--monitor-interval nan"),
        (["--shutdown-timeout", "-1"], "--shutdown-timeout -1 must not be negative"),
        (["--health-check-timeout", "inf"], "--health-check-timeout inf"),
        (["--exit-barrier-timeout", "1e300"], "more than a year"),
        (["--max-restarts", "10001"], "--max-restarts 10001 is out of range"),
        (["--node-rank", "1"], "--node-rank 1 is out of range for --nnodes 1"),
        (["--node-rank", "-1"], "--node-rank -1 is out of range"),
        (["--elastic-min", "0"], "--elastic-min 0"),
        (["--rdzv-id", ""], "--rdzv-id must not be empty"),
        (
            [
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "h:1",
                "--rdzv-conf",
                "read_timeout=1e300",
            ],
            "read_timeout 1e+300",
        ),
        (["--nnodes", "1:2"], "needs an elastic backend"),
        (["--rdzv-backend", "etcd"], "needs --rdzv-endpoint"),
    ],
)
def test_bad_values_are_one_configuration_error(tree: Path, args: list[str], words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _parse([*args, str(tree / "train.py")])
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_standalone_ignores_the_run_id(tree: Path) -> None:
    parsed = _parse(["--standalone", "--rdzv-id", "", str(tree / "train.py")])
    assert parsed.config.rdzv_backend == "c10d" and len(parsed.config.run_id) == 36


def test_the_rendezvous_conf_is_parsed_once_and_the_parse_is_what_the_rendezvous_gets(
    tree: Path,
) -> None:
    from elastic_run.rendezvous.api import RendezvousParameters

    script = str(tree / "train.py")
    # Static, as torchrun's launcher: the rank and 900 s unless --rdzv-conf names a timeout.
    config = _parse(["--node-rank", "0", script]).config
    assert config.rdzv_conf is not None
    assert dict(config.rdzv_configs) == {"rank": "0", "timeout": "900"}
    assert (config.rdzv_conf.settings.rank, config.rdzv_conf.settings.join_timeout_s) == (0, 900)
    given = _parse(["--rdzv-conf", "join_timeout=7,timeout=42", script]).config.rdzv_conf
    assert given is not None and given.settings.join_timeout_s == 7  # join_timeout wins
    # What run_job builds the handler from: the CLI's parse itself, not a second one.
    params = RendezvousParameters.from_conf(
        config.rdzv_backend,
        config.rdzv_endpoint,
        config.run_id,
        config.min_nodes,
        config.max_nodes,
        config.local_addr,
        config.rdzv_conf,
    )
    assert params.settings is config.rdzv_conf.settings
    # torchrun accepts --rdzv-conf timeout=5' for c10d, whose handler never reads `timeout`.
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    quoted = _parse([*c10d, "--rdzv-conf", "timeout=5'", script]).config
    assert quoted.rdzv_conf is not None and quoted.rdzv_conf.settings.join_timeout_s == 600
    with pytest.raises(ConfigurationError, match="--rdzv-conf timeout"):
        _parse(["--rdzv-conf", "timeout=5'", script])  # static reads it: refused, as torch
