"""What the workers will run, checked before anything starts: a script, a program or a module.

One concept: the run command's SCRIPT argument, in its three readings, each checked the way
the worker's own start would fail, so that a typo is one ``Error:`` line and exit 2 instead of
an agent that starts, spawns, and fails with exit 1:

- a script (the default): a file, relative to the current directory;
- a program (``--no-python``): a path with a ``/`` must be an executable file; a bare name is
  looked up on ``PATH``, as the worker's ``exec`` does (not in the current directory);
- a module (``-m``): found by the import system of this interpreter, with the current
  directory first on ``sys.path`` as ``python -m`` puts it (unless ``PYTHONSAFEPATH`` is set),
  WITHOUT importing the module. A dotted name is found level by level through the import
  system's finders (``sys.meta_path``) in the parent package's ``__path__``, which runs none of
  the user's code. Only when a submodule is missing from a package found on disk are the
  parents imported, as ``python -m`` would import them (such a package may extend its
  ``__path__`` at import time; their output is dropped), or when a finder needs them
  imported (a namespace package in a namespace package); an error raised while importing them
  is the reason given. A package needs a ``__main__`` submodule. When the workers run
  another interpreter (``PYTHON_EXEC``), its modules cannot be seen from here: no check.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from importlib.machinery import ModuleSpec
from pathlib import Path

from elastic_run.agent.settings.values import shown
from elastic_run.errors import ConfigurationError

__all__ = ["check_entrypoint", "find_module"]


def check_entrypoint(
    entrypoint: str,
    *,
    module: bool,
    no_python: bool,
    cwd: Path,
    environ: Mapping[str, str],
) -> None:
    """Check that the workers' command can start.

    Args:
        entrypoint: the SCRIPT argument.
        module: ``-m``: a module name.
        no_python: ``--no-python``: a program.
        cwd: the directory the workers start in (the agent's).
        environ: the workers' environment (``PATH``, ``PYTHON_EXEC``, ``PYTHONSAFEPATH``).

    Raises:
        ConfigurationError: both flags, or a script, program or module that is not there.
    """
    if module and no_python:
        raise ConfigurationError("-m/--module and --no-python cannot be used together")
    if no_python:
        _check_program(entrypoint, cwd, environ)
    elif module:
        python = environ.get("PYTHON_EXEC")
        if python and os.path.realpath(python) != os.path.realpath(sys.executable):
            return  # another interpreter: its modules are not ours to see
        safe_path = bool(environ.get("PYTHONSAFEPATH"))
        reason = find_module(entrypoint, None if safe_path else cwd)
        if reason is not None:
            raise ConfigurationError(f"-m {shown(entrypoint)}: {reason}")
    elif not os.path.isfile(cwd / entrypoint):  # False on any OSError (a name too long)
        raise ConfigurationError(f"the script {shown(entrypoint)} does not exist")


def _check_program(program: str, cwd: Path, environ: Mapping[str, str]) -> None:
    if "/" not in program:
        if shutil.which(program, path=environ.get("PATH", os.defpath)) is None:
            raise ConfigurationError(
                f"--no-python: the program {shown(program)} is not on PATH "
                "(a program in this directory is ./NAME)"
            )
        return
    path = cwd / program
    if not os.path.isfile(path):
        raise ConfigurationError(f"--no-python: the program {shown(program)} does not exist")
    if not os.access(path, os.X_OK):
        raise ConfigurationError(
            f"--no-python: the program {shown(program)} is not executable (chmod +x?)"
        )


@contextmanager
def _first_on_sys_path(directory: Path | None) -> Iterator[None]:
    """``sys.path`` as ``python -m`` starts with it, restored afterwards."""
    saved = list(sys.path)
    if directory is not None:
        sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        sys.path[:] = saved


def _from_finders(name: str, path: list[str]) -> ModuleSpec | None:
    """Ask every finder on ``sys.meta_path`` for ``name`` in ``path``, as ``import`` does."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded.__spec__
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec: ModuleSpec | None = find_spec(name, path, None)
        if spec is not None:
            return spec
    return None


def _walk(name: str) -> tuple[ModuleSpec | None, str, bool]:
    """Find ``name`` level by level without importing anything.

    Returns:
        (spec or None, why not, whether a package's import could still provide it: the miss
        was in a package found on disk, whose ``__init__`` may extend its ``__path__``).
    """
    parts = name.split(".")
    spec = importlib.util.find_spec(parts[0])  # a top-level name imports nothing
    for depth in range(1, len(parts)):
        parent = ".".join(parts[:depth])
        if spec is None:
            return None, f"no module named {parent!r}", False
        if spec.submodule_search_locations is None:
            return None, f"{parent!r} is a module, not a package", False
        child = ".".join(parts[: depth + 1])
        spec = _from_finders(child, list(spec.submodule_search_locations))
        if spec is None:
            return None, f"no module named {child!r}", True
    return spec, f"no module named {name!r}", False


def _import_and_find(name: str) -> tuple[ModuleSpec | None, str]:
    """``importlib.util.find_spec``, which imports the parents (their output is dropped)."""
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            return importlib.util.find_spec(name), f"no module named {name!r}"
    except (Exception, SystemExit) as exc:  # the user's package code: anything may escape
        detail = " ".join(str(exc).split())
        return None, f"cannot be found: {type(exc).__name__}: {detail}"


def _find(name: str) -> tuple[ModuleSpec | None, str]:
    try:
        spec, reason, in_package = _walk(name)
    except Exception:  # a finder that needs the parent imported (a namespace package's child)
        spec, reason, in_package = None, "", True
    if spec is None and in_package:
        spec, reason = _import_and_find(name)
    return spec, reason


def find_module(name: str, cwd: Path | None) -> str | None:
    """Find the module ``python -m name`` would run, without importing it.

    Args:
        name: the dotted module name.
        cwd: the directory ``python -m`` puts first on ``sys.path`` (None: none, as with
            ``PYTHONSAFEPATH``).

    Returns:
        None when found; else why not, as a short phrase (``no module named 'x'``).
    """
    hint = f" (a module is named without .py: -m {name[:-3]})" if name.endswith(".py") else ""
    if not all(part.isidentifier() for part in name.split(".")):
        return f"not a module name{hint}"
    with _first_on_sys_path(cwd):
        spec, reason = _find(name)
        if spec is None:
            return reason + hint
        if spec.submodule_search_locations is not None:
            main, _ = _find(f"{name}.__main__")
            if main is None:
                return f"{name!r} is a package without a __main__ module; it cannot be run"
    return None
