"""``elastic-run`` agents for the tests, forked from a template that imported torch once.

An agent spends most of its CPU importing torch (1.4-2.5 s of a ~2 s start on this 2-core host;
a run of the suite starts ~300 agents and is CPU-bound). :func:`start_agent` starts the console
script ``<venv>/bin/elastic-run ARGS`` as ``subprocess.Popen`` would, but forked from a template
process: warm starts' own zygote (``elastic_run/agent/warm/zygote_process.py``, through
``tests/agent_template_process.py``), which the warm-start tests hold to what a cold start sees.
The agent then runs in its own session with its stdio, cwd, environment, ``sys.argv``,
``sys.path[0]``, command line and ``/proc`` environ, its code from the console script on, torch
already in ``sys.modules`` (the agent's own imports of it are free), every elastic_run module
imported by the agent itself.

What differs from an exec, and why the tests do not see it: the agent's parent is the template
(it dies with it: parent-death SIGKILL), and the variables that the interpreter's start or
``import torch`` read are the template's. So an agent is forked only when its environment has the
template's value for each of those (``_STARTUP_PREFIXES``); each pytest process holds at most
``_MAX_TEMPLATES`` templates, one per such set. Otherwise, when ``ELASTIC_RUN_TEST_FORK_AGENTS=0``,
or when a template cannot start, the agent is exec'd as before. The tests of the launcher's own
start (the torchrun side-by-side runs, the demo, Slurm, the network namespaces, bad input) exec the
console script themselves.

:class:`ForkedAgent` is the ``Popen`` subset the tests use: ``pid``, ``args``, ``returncode``,
``poll``, ``wait`` (``subprocess.TimeoutExpired``), ``send_signal``, ``terminate``, ``kill``.
"""

from __future__ import annotations

import os
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
    "console_script",
    "start_agent",
    "template_pids",
]

FORK_VARIABLE = "ELASTIC_RUN_TEST_FORK_AGENTS"
# Read by the interpreter's start (PYTHON*, locale, malloc, the loader) or by torch's import
# (TORCH*, OpenMP, MKL, CUDA, NCCL), or used in sys.path and tempfile's defaults.
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
)
_MAX_TEMPLATES = 3
_READY_TIMEOUT_S = 120.0
_MARKER_VARIABLE = "ELASTIC_RUN_TEST_ID"  # tests/conftest.py's: a template is no test's process

_templates: dict[tuple[tuple[str, str], ...], _Template | None] = {}


def console_script() -> str:
    """``<venv>/bin/elastic-run``: the console script of this interpreter's environment."""
    return str(Path(sys.executable).with_name("elastic-run"))


class _Template(Zygote):
    program = Path(__file__).with_name("agent_template_process.py")


def template_pids() -> set[int]:
    """The pids of this process's templates (not any test's processes)."""
    return {t.pid for t in _templates.values() if t is not None and t.pid is not None}


def _startup_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_STARTUP_PREFIXES)))


def _template_for(env: Mapping[str, str]) -> _Template | None:
    key = _startup_key(env)
    if key in _templates:
        template = _templates[key]
        return template if template is not None and template.is_alive else None
    if (
        len(_templates) >= _MAX_TEMPLATES
        or threading.current_thread() is not threading.main_thread()
    ):
        return None  # (a template dies with the thread that started it: parent-death signal)
    template_env = {k: v for k, v in env.items() if k != _MARKER_VARIABLE}
    bin_dir = str(Path(console_script()).parent)
    template = _Template(python=sys.executable, env=template_env, path0=bin_dir, preload=[])
    try:
        template.start()
    except Exception:
        _templates[key] = None
        return None
    if template.wait_ready(_READY_TIMEOUT_S) is not None:
        template.close()
        _templates[key] = None
        return None
    _templates[key] = template
    return template


class ForkedAgent:
    """An agent forked from a template, waited for as a ``subprocess.Popen``."""

    def __init__(self, pid: int, template: _Template, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.template_pid = template.pid
        self._template = template

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._template.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if timeout is None:
                self.returncode = self._template.wait_exit(self.pid)
            else:
                self.returncode = self._template.exit_code(self.pid, timeout)
                if self.returncode is None:
                    raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not yet reaped by the template: the pid is still the agent's
            os.kill(self.pid, sig)

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
    argv = [console_script(), *args]
    forking = os.environ.get(FORK_VARIABLE) != "0" and os.access(argv[0], os.X_OK)
    template = _template_for(env) if forking else None
    if template is not None:
        where = os.fspath(cwd) if cwd is not None else os.getcwd()
        command = warm_command([sys.executable, *argv], sys.executable, where)
        assert not isinstance(command, str), command
        out = stdout
        err = stdout if stderr == subprocess.STDOUT else stderr
        try:
            child = template.spawn(command, [sys.executable, *argv], env, out, err, cwd=where)
        except Exception:
            pass  # the template died: exec this one
        else:
            return ForkedAgent(child.pid, template, argv)
    if not os.access(argv[0], os.X_OK):
        argv = [sys.executable, "-m", "elastic_run", *args]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
    )
