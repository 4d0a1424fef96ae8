"""The package's structure holds: pure cores import nothing of the outside world, dependencies
point one way (cli -> agent -> rendezvous), no two modules import each other (lazy and
type-checking imports included), no module reaches into another class's private attributes,
folders are subpackages of one concept that say what they own, and every ``__all__`` lists
exactly the public names its module defines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "elastic_run"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")

# Decisions live in these; they take what was read and `now`, and return what to do.
PURE = [
    "elastic_run/agent/loop/state_machine.py",
    "elastic_run/rendezvous/protocol/decisions.py",
    "elastic_run/rendezvous/protocol/records.py",
    "elastic_run/rendezvous/protocol/stable_ranks.py",
    "elastic_run/rendezvous/protocol/keys.py",
    "elastic_run/agent/watchdog/timer_table.py",
    "elastic_run/agent/progress/hang.py",
    "elastic_run/agent/progress/stragglers.py",
    "elastic_run/agent/progress/stack_report.py",
    "elastic_run/agent/progress/config.py",
    "elastic_run/agent/progress/script_end.py",
]
IMPURE_MODULES = {"socket", "threading", "time", "subprocess", "torch", "grpc", "psutil", "select"}
# A folder of more than about a dozen modules hides its architecture: group it by concept.
MAX_MODULES_PER_FOLDER = 12
# The rendezvous knows nothing of processes, except these modules, which run etcd itself.
_RUNS_ETCD = {
    "elastic_run/rendezvous/etcd/server.py",  # EtcdServer: a local etcd for tests, demos
    "elastic_run/rendezvous/embedded/member.py",  # this host's member of an embedded cluster
    "elastic_run/rendezvous/embedded/keeper.py",  # the process that runs it and cleans up
}
# Private names of the standard library and of namedtuples that code may use on any object.
_STDLIB_PRIVATES = {"_exit", "_getframe", "_current_frames", "_replace", "_asdict", "_fields"}
# Private names of other code used on purpose, each with its reason.
_PATCHES = {
    ("elastic_run/rendezvous/etcd/connection.py", "raw._clear_old_stubs"): (
        "pyetcd remakes gRPC stubs on a channel another thread closed: SIGSEGV"
    ),
    ("elastic_run/agent/warm/zygote_process.py", "runpy._run_module_as_main"): (
        "what `python -m` itself calls: the module runs in the real __main__ and stays there "
        "until shutdown, which runpy.run_module (a temporary module) would not do"
    ),
}


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
        if _name(path) not in _RUNS_ETCD:
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
def test_every_module_says_its_concept(path: Path) -> None:
    text = path.read_text()
    assert ast.get_docstring(ast.parse(text)), f"{_name(path)} has no module docstring"


FOLDERS = sorted({p.parent for p in MODULES})


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: str(f.relative_to(PACKAGE.parent)))
def test_every_folder_is_one_concept_of_a_readable_size(folder: Path) -> None:
    modules = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(modules) <= MAX_MODULES_PER_FOLDER, (folder, len(modules))
    init = folder / "__init__.py"
    assert init.exists(), f"{folder} is not a package"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert len(doc.split()) >= 15, f"{init} does not say what the folder owns"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _internal_imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules ``path`` imports anywhere (functions and TYPE_CHECKING included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known}


def test_no_two_modules_import_each_other() -> None:
    """No import circle, however hidden (a lazy import or one under TYPE_CHECKING counts)."""
    names = {_module_name(p): p for p in MODULES}
    known = set(names)
    graph = {
        m: {d for d in _internal_imports(p, known) if not m.startswith(d + ".") and d != m}
        for m, p in names.items()
        if m != "elastic_run"
    }
    graph = {m: {d for d in ds if d in graph} for m, ds in graph.items()}
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        for dep in sorted(graph[node]):
            walk(dep, [*path, node])
        done.add(node)

    for module in sorted(graph):
        walk(module, [])


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_reaches_into_another_objects_private_attributes(path: Path) -> None:
    """``x._name`` only on ``self``, ``cls``, ``super()`` or the module's own classes: a module
    that reads another class's private state is that class in disguise."""
    tree = ast.parse(path.read_text())
    own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in _STDLIB_PRIVATES:
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ({"self", "cls"} | own_classes):
            continue
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "super":
            continue
        if _is_same_class_peer(tree, node) or (_name(path), ast.unparse(node)) in _PATCHES:
            continue
        bad.append(f"{ast.unparse(node)} (line {node.lineno})")
    assert not bad, f"{_name(path)}: {bad}"


def _is_same_class_peer(tree: ast.Module, node: ast.Attribute) -> bool:
    """``other._x`` inside a method of a class that defines ``_x`` itself (a peer instance)."""
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if not any(n is node for n in ast.walk(cls)):
            continue
        assigned = {
            t.attr
            for n in ast.walk(cls)
            for t in (n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)])
            if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
        }
        fields = {
            n.target.id
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        methods = {
            n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        return node.attr in assigned | fields | methods
    return False


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


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if p.relative_to(PACKAGE).parts[0] in ("cli", "agent")],
    ids=_name,
)
def test_the_cli_and_the_agent_use_the_rendezvous_through_its_typed_seam(path: Path) -> None:
    """No ``isinstance`` on the concrete handler, no reaching into a handler's ``.backend``:
    reachability, release, telemetry, status and close are public calls of the rendezvous."""
    tree = ast.parse(path.read_text())
    bad = [
        f"{ast.unparse(n)} (line {n.lineno})"
        for n in ast.walk(tree)
        if (isinstance(n, ast.Name) and n.id == "DynamicRendezvousHandler")
        or (isinstance(n, ast.Attribute) and n.attr == "backend" and "handler" in ast.unparse(n))
    ]
    assert not bad, f"{_name(path)}: {bad}"
