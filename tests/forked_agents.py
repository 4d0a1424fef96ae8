"""``elastic-run`` agents for the tests, forked from a template that imported torch once.

An agent spends most of its CPU importing torch (1.4-2.5 s of a ~2 s start on the 2-core host
the suite is timed on; a run starts ~300 agents and is CPU-bound). :func:`start_agent` starts the console
script ``<venv>/bin/elastic-run ARGS`` as ``subprocess.Popen`` would, but forked from a template
process: warm starts' own zygote (``elastic_run/agent/warm/zygote_process.py``, through
``tests/agent_template_process.py``), which the warm-start tests hold to what a cold start sees.
The agent then runs in its own session with its stdio, cwd, environment, ``sys.argv``,
``sys.path[0]``, command line and ``/proc`` environ, its code from the console script on, torch
and the modules every run imports (``PRELOADED``: the CLI, the agent, the c10d rendezvous, rich,
click, psutil; not the etcd client) already in ``sys.modules``: the agent's own imports of them
are free.

What differs from an exec, and how the harness keeps the tests from seeing it:

- What the interpreter's start, ``import torch`` and the import of ``PRELOADED`` read
  (``_STARTUP_PREFIXES``: PYTHON*, locale, malloc, the loader, TORCH*, OpenMP, MKL, CUDA, NCCL,
  TZ, TMP*, HOME, PATH, PSUTIL*) is the template's: an
  agent is forked only from a template started with its own values of those, as they are when the
  agent imports torch (the CLI sets ``TORCH_CPP_LOG_LEVEL`` first: ``_import_env``). The first
  agent of each such set is exec'd, the later ones forked; a pytest process holds at most
  ``_MAX_TEMPLATES`` templates, and past that, agents are exec'd.
- The ``PRELOADED`` modules ran their import-time code in the template, before the agent's
  environment existed: what they read then is a start-up variable
  (``test_the_preloads_read_only_start_up_variables``), and none starts a thread (the zygote
  refuses a preload that does).
- Anything ``import torch`` prints would be lost: a template whose import printed a word is
  never ready (``tests/agent_template_process.py``), and its agents are exec'd.
- The string hash seed is the template's: ``_SLOTS`` templates per set of variables, each with
  its own seed, are taken in turn, so the agents of a multi-node job do not share one.
- The agent's parent is the template, and it dies with it (parent-death SIGKILL); its resource
  limits, umask and CPU affinity are those of pytest when the template started (no test changes
  them); torch's warning filters were added before the agent's own set-up, not after.
- ``/proc/PID/cmdline`` is the command joined by spaces (an argument with a space in it comes
  back split), and ``/proc/PID/environ`` also lists the template's variables that the agent's
  environment lacks.

``ELASTIC_RUN_TEST_FORK_AGENTS=0`` execs every agent. The tests of the launcher's own start (the
torchrun side-by-side runs, the demo, Slurm, the network namespaces, ``--help`` without torch)
exec the console script themselves; ``tests/e2e/test_forked_agents.py`` runs the same jobs both
ways and compares what a test sees.

:class:`ForkedAgent` is the ``Popen`` subset the tests use: ``pid``, ``args``, ``returncode``,
``poll``, ``wait`` (``subprocess.TimeoutExpired``), ``send_signal``, ``terminate``, ``kill``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from elastic_run.agent.warm.zygote import Zygote, warm_command

__all__ = [
    "AgentProcess",
    "ForkedAgent",
    "cli_command",
    "console_script",
    "start_agent",
    "template_pids",
]

FORK_VARIABLE = "ELASTIC_RUN_TEST_FORK_AGENTS"
# Read by the interpreter's start (PYTHON*, locale, malloc, the loader), by torch's import
# (TORCH*, OpenMP, MKL, CUDA, NCCL) or by the PRELOADED modules' (locale, PSUTIL_DEBUG), or used
# in sys.path and tempfile's defaults.
_STARTUP_PREFIXES = (
    "PYTHON",
    "LC_",
    "LANG",
    "LD_",
    "MALLOC_",
    "GLIBC_",
    "TORCH",
    "PYTORCH",
    "OMP_",
    "KMP_",
    "MKL_",
    "GOMP_",
    "CUDA",
    "NCCL",
    "TZ",
    "TMP",
    "TEMP",
    "HOME",
    "PATH",
    "PSUTIL_",
)
# torchrun's and the launcher's own variables: read by the CLI at run time, not by torch's import.
_RUNTIME_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")
_MAX_TEMPLATES = 4
# What every `elastic-run` run, status and close imports, whatever its backend, imported once by
# the template (warm starts' --preload): 0.3 s of CPU an agent here. Not the etcd client: the CLI
# turns gRPC's fork support off before grpc is imported (elastic_run.rendezvous.etcd.grpc_fork).
PRELOADED = (
    "elastic_run.cli.main",
    "elastic_run.cli.run",
    "elastic_run.cli.status",
    "elastic_run.cli.views.lines",
    "elastic_run.cli.launcher_error",
    "elastic_run.cli.options.torchrun_flags",
    "elastic_run.cli.slurm.allocation",
    "elastic_run.agent.local",
    "elastic_run.rendezvous.registry",
    "elastic_run.rendezvous.dynamic.handler",
    "elastic_run.rendezvous.c10d.backend",
    "elastic_run.rendezvous.etcd.grpc_fork",
)
# Templates per set of start-up variables, taken in turn: each has its own hash seed, so the
# agents of a multi-node job do not all share one (an exec'd agent draws its own).
_SLOTS = 2
_READY_TIMEOUT_S = 120.0
_MARKER_VARIABLE = "ELASTIC_RUN_TEST_ID"  # tests/conftest.py's: a template is no test's process
# What the CLI sets in its own environment before it imports torch (elastic_run/cli/main.py for a
# run, always; elastic_run/cli/status.py for status and close, unless set): torch reads it then.
_CPP_LOG_LEVEL = ("TORCH_CPP_LOG_LEVEL", "FATAL")
_READER_COMMANDS = ("status", "close")

_Key = tuple[tuple[str, str], ...]
_templates: dict[tuple[_Key, int], _Template | None] = {}
_uses: dict[_Key, int] = {}


def console_script() -> str:
    """``<venv>/bin/elastic-run``: the console script of this interpreter's environment."""
    return str(Path(sys.executable).with_name("elastic-run"))


def cli_command() -> list[str]:
    """The command that runs the CLI: the console script, or ``python -m elastic_run``."""
    script = console_script()
    if os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "elastic_run"]


class _Template(Zygote):
    program = Path(__file__).with_name("agent_template_process.py")


def template_pids() -> set[int]:
    """The pids of this process's templates (not any test's processes)."""
    return {t.pid for t in _templates.values() if t is not None and t.pid is not None}


def _import_env(args: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment as it will be when it imports torch."""
    found = dict(env)
    name, value = _CPP_LOG_LEVEL
    if args and args[0] in _READER_COMMANDS:
        found.setdefault(name, value)
    else:
        found[name] = value
    return found


def _startup_variable(name: str) -> bool:
    return name.startswith(_STARTUP_PREFIXES) and not name.startswith(_RUNTIME_PREFIXES)


def _template_for(args: Sequence[str], env: Mapping[str, str]) -> _Template | None:
    """A running template for an agent with ``args`` and ``env``, or None (exec it).

    The first agent of a set of start-up variables is exec'd (a set used once, as the bad-input
    tests' odd values are, never pays for a template); the later ones take the set's templates
    in turn.
    """
    start_env = _import_env(args, env)
    key = tuple(sorted((k, v) for k, v in start_env.items() if _startup_variable(k)))
    uses = _uses.get(key, 0)
    _uses[key] = uses + 1
    if uses == 0:
        return None
    slot = (key, uses % _SLOTS)
    if slot in _templates:
        template = _templates[slot]
        return template if template is not None and template.is_alive else None
    if (
        len(_templates) >= _MAX_TEMPLATES
        or threading.current_thread() is not threading.main_thread()
    ):
        return None  # (a template dies with the thread that started it: parent-death signal)
    template_env = {k: v for k, v in start_env.items() if k != _MARKER_VARIABLE}
    template_env.setdefault("PYTHONHASHSEED", str(random.randrange(1, 2**32)))
    bin_dir = str(Path(console_script()).parent)
    template = _Template(
        python=sys.executable, env=template_env, path0=bin_dir, preload=list(PRELOADED)
    )
    _templates[slot] = None
    try:
        template.start()
    except Exception:
        return None
    if template.wait_ready(_READY_TIMEOUT_S) is not None:
        template.close()  # e.g. importing torch printed something (agent_template_process.py)
        return None
    _templates[slot] = template
    return template


class ForkedAgent:
    """An agent forked from a template, waited for as a ``subprocess.Popen``.

    The template reaps the agent at once: between its exit and the report of it, the pid is
    free, so a signal then finds no process (ignored, as ``Popen`` does).
    """

    def __init__(self, pid: int, template: _Template, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._template = template

    @property
    def template_pid(self) -> int | None:
        return self._template.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._template.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._template.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # it exited; its report is on the way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ForkedAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()


AgentProcess = ForkedAgent | subprocess.Popen[bytes]


def start_agent(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    stdout: int | IO[bytes],
    stderr: int | IO[bytes],
    cwd: str | os.PathLike[str] | None = None,
) -> AgentProcess:
    """Start ``elastic-run ARGS`` in its own session, stdin ``/dev/null``, forked or exec'd.

    ``stderr`` may be ``subprocess.STDOUT``.
    """
    if subprocess.PIPE in (stdout, stderr):
        raise ValueError("start_agent takes files or descriptors, not PIPE (use run_cli)")
    argv = [console_script(), *args]
    forking = os.environ.get(FORK_VARIABLE) != "0" and os.access(argv[0], os.X_OK)
    template = _template_for(args, env) if forking else None
    if template is None:
        return subprocess.Popen(
            [*cli_command(), *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    command = warm_command([sys.executable, *argv], sys.executable, where)
    assert not isinstance(command, str), command
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        out = devnull if stdout == subprocess.DEVNULL else stdout
        err = out if stderr == subprocess.STDOUT else stderr
        err = devnull if err == subprocess.DEVNULL else err
        # Once the request is sent, an error is the test's: exec'ing the agent then could start
        # it twice.
        child = template.spawn(command, [sys.executable, *argv], env, out, err, cwd=where)
    finally:
        os.close(devnull)
    return ForkedAgent(child.pid, template, argv)
