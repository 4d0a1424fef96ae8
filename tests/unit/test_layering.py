"""The package's structure holds: pure cores import nothing of the outside world, dependencies
point one way (cli -> agent -> rendezvous), every module stays under the house limit, and every
``__all__`` lists exactly the public names its module defines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "elastic_run"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")

# Decisions live in these; they take what was read and `now`, and return what to do.
PURE = [
    "elastic_run/agent/state_machine.py",
    "elastic_run/rendezvous/protocol.py",
    "elastic_run/rendezvous/records.py",
    "elastic_run/rendezvous/stable_ranks.py",
    "elastic_run/rendezvous/keys.py",
    "elastic_run/agent/timer_table.py",
    "elastic_run/agent/hang.py",
    "elastic_run/agent/stragglers.py",
    "elastic_run/agent/stack_report.py",
    "elastic_run/agent/progress_config.py",
    "elastic_run/agent/script_end.py",
]
IMPURE_MODULES = {"socket", "threading", "time", "subprocess", "torch", "grpc", "psutil", "select"}
MAX_LINES = 500


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names, top-level and nested)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("rel", PURE)
def test_the_pure_cores_import_no_io(rel: str) -> None:
    imported = {name.split(".")[0] for name in _imports(PACKAGE.parent / rel)}
    assert not imported & IMPURE_MODULES, (rel, imported & IMPURE_MODULES)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_dependencies_point_one_way(path: Path) -> None:
    layer = path.relative_to(PACKAGE).parts[0]
    imported = _imports(path)
    if layer == "rendezvous":
        forbidden = ("elastic_run.agent", "elastic_run.cli", "click", "rich")
        if path.name != "etcd_server.py":  # EtcdServer's one job is to run etcd processes
            forbidden += ("subprocess",)
    elif layer == "agent":
        forbidden = ("elastic_run.cli", "click", "rich")
    elif layer == "worker.py":
        forbidden = ("elastic_run.agent", "elastic_run.cli", "elastic_run.rendezvous", "torch")
    else:
        forbidden = ()
    bad = sorted(m for m in imported if m.startswith(forbidden))
    assert not bad, (_name(path), bad)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_every_module_is_under_the_house_limit_and_says_its_concept(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES, _name(path)
    if path.name != "__init__.py" or len(text.splitlines()) > 3:
        assert ast.get_docstring(ast.parse(text)), f"{_name(path)} has no module docstring"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_every_all_is_complete(path: Path) -> None:
    """``__all__`` holds every public class, function and constant the module defines."""
    tree = ast.parse(path.read_text())
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    public = {n for n in defined if not n.startswith("_") and n not in ("log", "logger")}
    module = importlib.import_module(_name(path).removesuffix(".py").replace("/", "."))
    exported = set(getattr(module, "__all__", ()))
    if not exported and path.name == "__init__.py":
        return
    assert exported, f"{_name(path)} has no __all__"
    missing = sorted(public - exported - _TYPE_ALIASES_AND_VARS(module, public))
    assert not missing, f"{_name(path)}: public names missing from __all__: {missing}"
    unknown = sorted(n for n in exported if not hasattr(module, n))
    assert not unknown, f"{_name(path)}: __all__ names what it does not define: {unknown}"


def _TYPE_ALIASES_AND_VARS(module: object, names: set[str]) -> set[str]:  # noqa: N802
    """Type variables are not part of an API (``T = TypeVar("T")``)."""
    from typing import TypeVar

    return {n for n in names if isinstance(getattr(module, n, None), TypeVar)}
