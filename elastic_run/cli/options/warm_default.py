"""Whether a job starts its workers warm when ``--warm-start/--no-warm-start`` is not given.

A warm start forks each worker from a per-node zygote that has already imported torch (see
``agent/warm/zygote.py``). That is a win for any worker that imports torch, and a loss for a worker
that never would: its first launch then waits for an ``import torch`` it does not need. So the
default is decided from the training script's own import statements, read (never run) here:

- ``--no-python``: cold (the workers are programs, not Python scripts);
- ``--preload`` given: warm (the user named modules to preload);
- a script (or ``-m`` module) whose every import names a standard-library module: cold, since it
  provably never imports torch itself;
- any other import (torch, a library, a module of the user's): warm;
- a script that cannot be read or parsed: cold (the worker then reports its own error).

The zygote keeps its own safety checks at run time (no thread, CUDA not initialized after the
preload); a zygote that refuses makes the job start cold with one line.

Invariants: no import, no execution of the user's code; one file read at most.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

__all__ = ["default_warm_start", "imported_modules"]


def imported_modules(source: str) -> set[str]:
    """The top-level names of every module that ``source`` imports (``"."`` for relative ones).

    Dynamic imports by a literal name (``__import__("x")``, ``importlib.import_module("x")``)
    count too.

    Raises:
        SyntaxError, ValueError: ``source`` is not Python.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level or node.module is None else node.module.split(".")[0])
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value.split(".")[0])
    return names


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def default_warm_start(
    script: str, *, module: bool, no_python: bool, preload: tuple[str, ...], cwd: Path
) -> tuple[bool, str]:
    """The default warm-start mode of a job and the reason shown by ``--print-config``.

    Args:
        script: the training script's path (or the module's name with ``module``).
        module: ``-m``.
        no_python: ``--no-python``.
        preload: ``--preload`` modules.
        cwd: where a relative script path is resolved.
    """
    if no_python:
        return False, "--no-python: workers are programs, started cold"
    if preload:
        return True, "default: on (--preload given)"
    if module:
        top = script.split(".")[0]
        if top in sys.stdlib_module_names:
            return False, f"default: off (-m {top} is a standard-library module)"
        return True, f"default: on (-m {script}: torch is preloaded for it)"
    try:
        names = imported_modules((cwd / script).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return False, "default: off (the script could not be read as Python)"
    others = sorted(name for name in names if name not in sys.stdlib_module_names)
    if not others:
        return False, "default: off (the script imports only the standard library)"
    shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    return True, f"default: on (the script imports {shown}; torch is preloaded)"
