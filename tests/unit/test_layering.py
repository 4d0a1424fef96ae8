"""The package's structure holds: pure cores import nothing of the outside world, dependencies
point one way (cli -> agent -> rendezvous), each subpackage of the agent and the rendezvous imports
only what its docstring says, there is no import circle (lazy, type-checking and ``importlib``
imports, and a package ``__init__`` imported back by its own module, included), no module reaches
into another class's private attributes (a base class's included), folders are subpackages of
one concept that name every module they own, and every ``__all__`` lists exactly the public names
its module defines."""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "elastic_run"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")

# Decisions live in these; they take what was read and `now`, and return what to do.
# Every module of agent/rules/ (the verdicts) is pure too: RULES below.
PURE = [
    "elastic_run/agent/loop/state_machine.py",
    "elastic_run/rendezvous/protocol/decisions.py",
    "elastic_run/rendezvous/protocol/records.py",
    "elastic_run/rendezvous/protocol/stable_ranks.py",
    "elastic_run/rendezvous/protocol/keys.py",
    "elastic_run/agent/watchdog/timer_table.py",
    "elastic_run/agent/progress/stack_report.py",
    "elastic_run/agent/progress/config.py",
    "elastic_run/agent/loop/snapshot.py",
    "elastic_run/agent/loop/goodput.py",
    "elastic_run/agent/node_check/options.py",
    "elastic_run/agent/node_check/flag_rows.py",
    "elastic_run/agent/node_check/result.py",
    "elastic_run/agent/node_check/lines.py",
    "elastic_run/agent/node_check/device_request.py",
    "elastic_run/cli/report/model.py",
    "elastic_run/cli/report/events_file.py",
    "elastic_run/cli/report/phases.py",
    "elastic_run/cli/report/clocks.py",
    "elastic_run/cli/report/markers.py",
    "elastic_run/cli/report/rows.py",
    "elastic_run/cli/report/build.py",
    "elastic_run/cli/report/html_page.py",
    "elastic_run/agent/link_check/mode.py",
    "elastic_run/agent/link_check/report.py",
    "elastic_run/agent/link_check/schedule.py",
    "elastic_run/agent/link_check/verdict.py",
] + sorted(
    str(p.relative_to(Path(__file__).resolve().parents[2]))
    for p in (Path(__file__).resolve().parents[2] / "elastic_run" / "agent" / "rules").rglob("*.py")
)
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


def _module_name(path: Path) -> str:
    """``elastic_run/agent/api.py`` is ``elastic_run.agent.api``; a package is its ``__init__``."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ROOT = PACKAGE.name
NAMES = {_module_name(p): p for p in MODULES}  # every module and package, the root included


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


class _Site(NamedTuple):
    """One import: ``import a.b`` is ``("a.b", None, "a")``, ``from a import b as c`` is
    ``("a", "b", "c")``, ``importlib.import_module("a.b")`` is ``("a.b", None, "")``."""

    module: str
    name: str | None
    local: str
    line: int


@functools.cache
def _import_sites(path: Path) -> list[_Site]:
    """Every import in ``path``, wherever it stands (functions, ``TYPE_CHECKING``), a relative one
    made absolute, and ``importlib.import_module`` or ``__import__`` of a literal name."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    sites: list[_Site] = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            sites += [
                _Site(a.name, None, a.asname or a.name.split(".")[0], node.lineno)
                for a in node.names
            ]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            sites += [_Site(module, a.name, a.asname or a.name, node.lineno) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).rsplit(".", 1)[-1] in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            sites.append(_Site(node.args[0].value, None, "", node.lineno))
    return sites


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports; for ``from m import x`` both ``m`` and ``m.x`` (x may be a
    module: ``from elastic_run import agent`` imports ``elastic_run.agent``)."""
    found: set[str] = set()
    for site in _import_sites(path):
        found.add(site.module)
        if site.name is not None:
            found.add(f"{site.module}.{site.name}")
    return found


def _under(module: str, prefixes: Iterable[str]) -> bool:
    """``module`` is one of ``prefixes`` or inside one (``a.b`` is under ``a``; ``ab`` is not)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _internal_edges(path: Path) -> dict[str, list[int]]:
    """The package's modules that ``path`` needs, each with the lines that import it.

    ``from m import x`` needs ``m.x`` when that is a module, else ``m`` itself (the names of its
    ``__init__``: the edge of a package's hidden circle); ``import a.b`` needs ``a.b``. The parent
    packages Python runs on the way are left out: a half-run parent fails only an import of one
    of its own names, and that is the ``from m import x`` edge.
    """
    me = _module_name(path)
    edges: dict[str, list[int]] = {}
    for site in _import_sites(path):
        sub = f"{site.module}.{site.name}"
        target = sub if site.name is not None and sub in NAMES else site.module
        while target not in NAMES and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in NAMES and target != me:
            edges.setdefault(target, []).append(site.line)
    return edges


@pytest.mark.parametrize("rel", PURE)
def test_the_pure_cores_import_no_io(rel: str) -> None:
    imported = {name.split(".")[0] for name in _imports(PACKAGE.parent / rel)}
    assert not imported & IMPURE_MODULES, (rel, imported & IMPURE_MODULES)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_dependencies_point_one_way(path: Path) -> None:
    layer = path.relative_to(PACKAGE).parts[0]
    imported = _imports(path)
    forbidden: tuple[str, ...]
    if layer == "rendezvous":
        forbidden = ("elastic_run.agent", "elastic_run.cli", "click", "rich")
        if _name(path) not in _RUNS_ETCD:
            forbidden += ("subprocess",)
    elif layer == "agent":
        forbidden = ("elastic_run.cli", "click", "rich")
    elif layer == "worker":
        # What runs in the worker's interpreter: nothing of the launcher, no torch at import.
        forbidden = (
            "elastic_run.agent",
            "elastic_run.cli",
            "elastic_run.rendezvous",
            "elastic_run.elastic",
            "torch",
        )
    else:
        forbidden = ()
    bad = sorted(m for m in imported if _under(m, forbidden))
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


# What each subpackage of agent/ and rendezvous/ may import of elastic-run besides itself: the
# "May import" of its docstring. A name allows that module and, for a package, its modules; the
# root ``elastic_run`` allows only itself.
_MAY_IMPORT: dict[str, set[str]] = {
    "elastic_run.agent.health": {
        "elastic_run.agent.events",  # the records its metrics count
        "elastic_run.agent.loop.snapshot",  # the published picture its views read
        "elastic_run.descriptors",
        "elastic_run.errors",
    },
    "elastic_run.agent.node_check": {
        "elastic_run.errors",
        "elastic_run.parent_death",
        "elastic_run.rendezvous.settings",
    },
    "elastic_run.agent.link_check": {"elastic_run.errors", "elastic_run.parent_death"},
    "elastic_run.agent.loop": {
        "elastic_run.agent.api",
        "elastic_run.agent.config",
        "elastic_run.agent.events",
        "elastic_run.agent.rules",
        "elastic_run.agent.settings.table",  # the keyword defaults of SimpleElasticAgent
        "elastic_run.metrics",  # torch's agent metrics (put_metric, @prof)
        "elastic_run.rendezvous.dynamic.telemetry",  # the fault records (node_ledger.py)
        "elastic_run.torch_events",  # torch's agent events (get_event_succeeded...)
        "elastic_run.agent.workers.failures",
        "elastic_run.errors",
        "elastic_run.rendezvous.api",
        "elastic_run.rendezvous.errors",
        "elastic_run.rendezvous.outage",  # an unreachable backend said once
    },
    "elastic_run.agent.progress": {
        "elastic_run",  # its path: library frames apart from the script's
        "elastic_run.agent.loop.snapshot",
        "elastic_run.agent.rules",
        "elastic_run.agent.workers.failures",
        "elastic_run.agent.workers.group",
        "elastic_run.agent.workers.processes",
        "elastic_run.worker.auto_progress",
        "elastic_run.worker.beat_file",
        "elastic_run.rendezvous.dynamic.telemetry",
        "elastic_run.rendezvous.errors",
    },
    "elastic_run.agent.rules": {
        "elastic_run.agent.api",
        "elastic_run.agent.loop.snapshot",
        "elastic_run.agent.progress.stack_report",
        "elastic_run.agent.workers.failures",
    },
    "elastic_run.agent.rules.nodes": {
        "elastic_run.agent.api",
        "elastic_run.agent.rules",
    },
    "elastic_run.agent.rules.progress": {
        "elastic_run.agent.api",
        "elastic_run.agent.rules",
        "elastic_run.agent.loop.snapshot",
        "elastic_run.agent.progress.stack_report",
    },
    "elastic_run.agent.settings": {
        "elastic_run.agent.link_check.mode",  # --link-check's parser
        "elastic_run.agent.node_check.options",  # the node check's parsers and its default
        "elastic_run.agent.progress.config",  # the progress settings' defaults and parsers
        "elastic_run.agent.rules.progress.beats",
        "elastic_run.agent.rules.progress.script_end",
        "elastic_run.errors",
        "elastic_run.rendezvous.settings",
    },
    "elastic_run.agent.warm": {
        "elastic_run.agent.workers.env",
        "elastic_run.agent.workers.processes",
        "elastic_run.worker.auto_progress",  # in a forked worker, before its script
        "elastic_run.errors",
        "elastic_run.worker.exit_guard",  # in a forked worker, before its script
        "elastic_run.parent_death",
    },
    "elastic_run.agent.watchdog": {"elastic_run.errors", "elastic_run.worker.timer_wire"},
    "elastic_run.agent.workers": {
        "elastic_run.agent.api",
        "elastic_run.agent.config",
        "elastic_run.agent.rules.observation",
        "elastic_run.worker.auto_progress",
        "elastic_run.errors",
        "elastic_run.parent_death",
        "elastic_run.rendezvous.owned_dir",  # the function workers' folder
        "elastic_run.worker.site_hook",
        "elastic_run.worker",
    },
    "elastic_run.rendezvous.c10d": {
        "elastic_run.errors",
        "elastic_run.rendezvous.api",
        "elastic_run.rendezvous.backend",
        "elastic_run.rendezvous.endpoints",
        "elastic_run.rendezvous.errors",
        "elastic_run.rendezvous.protocol.keys",
        "elastic_run.rendezvous.protocol.records",
        "elastic_run.rendezvous.settings",
    },
    "elastic_run.rendezvous.dynamic": {
        "elastic_run.clock",
        "elastic_run.rendezvous.api",
        "elastic_run.rendezvous.backend",
        "elastic_run.rendezvous.errors",
        "elastic_run.rendezvous.outage",  # an unreachable backend said once
        "elastic_run.rendezvous.liveness",
        "elastic_run.rendezvous.protocol",
        "elastic_run.rendezvous.settings",
    },
    "elastic_run.rendezvous.embedded": {
        "elastic_run.errors",
        "elastic_run.rendezvous.api",
        "elastic_run.rendezvous.endpoints",
        "elastic_run.rendezvous.errors",
        "elastic_run.rendezvous.owned_dir",
        "elastic_run.rendezvous.etcd",
        "elastic_run.rendezvous.protocol.keys",
        "elastic_run.rendezvous.settings",
    },
    "elastic_run.rendezvous.etcd": {
        "elastic_run.errors",
        "elastic_run.rendezvous.owned_dir",
        "elastic_run.parent_death",
        "elastic_run.rendezvous.api",
        "elastic_run.rendezvous.backend",
        "elastic_run.rendezvous.endpoints",
        "elastic_run.rendezvous.errors",
        "elastic_run.rendezvous.settings",
    },
    "elastic_run.rendezvous.liveness": {
        "elastic_run.clock",
        "elastic_run.descriptors",
        "elastic_run.rendezvous.api",
        "elastic_run.rendezvous.backend",
        "elastic_run.rendezvous.errors",
        "elastic_run.rendezvous.outage",  # an unreachable backend said once
        "elastic_run.rendezvous.protocol",
        "elastic_run.rendezvous.settings",
    },
    "elastic_run.rendezvous.protocol": {
        "elastic_run.rendezvous.api",
        "elastic_run.rendezvous.errors",
    },
}
SUBPACKAGES = sorted(
    p.parent
    for p in MODULES
    if p.name == "__init__.py"
    and any(
        p.parent != top and top in p.parent.parents
        for top in (PACKAGE / "agent", PACKAGE / "rendezvous")
    )
)


def _folder_id(folder: Path) -> str:
    return str(folder.relative_to(PACKAGE.parent))


def _edges_out_of(folder: Path) -> list[tuple[str, str, int]]:
    """(file, module, line) for each module of the package the folder's files import, the
    folder's own modules left out."""
    package = _module_name(folder / "__init__.py")
    return [
        (path.name, target, lines[0])
        for path in sorted(folder.glob("*.py"))
        for target, lines in sorted(_internal_edges(path).items())
        if not _under(target, [package])
    ]


def test_every_subpackage_of_the_agent_and_the_rendezvous_has_an_import_rule() -> None:
    names = {_module_name(folder / "__init__.py") for folder in SUBPACKAGES}
    assert names == set(_MAY_IMPORT), (
        f"without a rule: {sorted(names - set(_MAY_IMPORT))}; "
        f"a rule for no subpackage: {sorted(set(_MAY_IMPORT) - names)}"
    )


@pytest.mark.parametrize("folder", SUBPACKAGES, ids=_folder_id)
def test_each_subpackage_imports_only_what_its_docstring_allows(folder: Path) -> None:
    allowed = _MAY_IMPORT.get(_module_name(folder / "__init__.py"), set())
    bad = [
        f"{file}:{line} imports {target}"
        for file, target, line in _edges_out_of(folder)
        if target not in allowed and not _under(target, allowed - {ROOT})
    ]
    assert not bad, (
        f"{_folder_id(folder)} imports what its docstring's 'May import' does not say "
        f"(fix the import, or the docstring and _MAY_IMPORT together): {bad}"
    )


def test_the_run_loop_never_imports_progress() -> None:
    """One way: agent/progress reads the loop's snapshot and feeds its state machine, so the loop
    never reads agent/progress back (the goodput account it folds lives in agent/loop)."""
    bad = [
        f"{file}:{line} imports {target}"
        for file, target, line in _edges_out_of(PACKAGE / "agent" / "loop")
        if _under(target, ["elastic_run.agent.progress"])
    ]
    assert not bad, (
        "agent/loop must never import agent/progress (progress -> loop, one way): move what the "
        f"loop needs into agent/loop, as goodput.py was: {bad}"
    )


@pytest.mark.parametrize("folder", SUBPACKAGES, ids=_folder_id)
def test_each_subpackage_names_every_module_it_owns(folder: Path) -> None:
    doc = ast.get_docstring(_tree(folder / "__init__.py")) or ""
    modules = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(m for m in modules if f"``{m}``" not in doc)
    assert not missing, f"{_folder_id(folder)}/__init__.py does not name {missing}"
    gone = sorted(set(re.findall(r"``(\w+\.py)``", doc)) - modules)
    assert not gone, f"{_folder_id(folder)}/__init__.py names modules it does not hold: {gone}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    """No import circle anywhere in the package, the root ``elastic_run`` included, however hidden:
    a lazy import, one under TYPE_CHECKING, ``importlib.import_module("...")`` of a literal name,
    and a package whose ``__init__`` imports a module that imports the ``__init__``'s names back."""
    edges = {module: _internal_edges(path) for module, path in NAMES.items()}
    circles = _circles({module: set(deps) for module, deps in edges.items()})
    report = [
        "import circle: "
        + "; ".join(
            f"{a} -> {b} (line {', '.join(map(str, sorted(set(edges[a][b]))))})"
            for a in circle
            for b in sorted(edges[a])
            if b in circle
        )
        for circle in circles
    ]
    assert not report, "\n".join(report)


# Hooks torch's SimpleElasticAgent declares for a subclass, exactly the ones torch's own
# LocalElasticAgent (another module) overrides or calls: a subclass may define and call these.
_TORCH_AGENT_HOOKS = {"_start_workers", "_stop_workers", "_monitor_workers", "_shutdown"}
# Our own hooks, declared (with a default body) by a base class for its subclasses to fill: a
# subclass may define and call these methods, never the base's state. class -> method names.
_DECLARED_HOOKS = {
    # the run loop's services and per-worker views (agent/loop/simple.py, "optional hooks")
    "SimpleElasticAgent": {"_setup", "_teardown", "_begin_stop_workers"},
    # torch's ErrorHandler's, kept by our mirror: where the error file goes
    "ErrorHandler": {"_get_error_file_path"},
}


class _Class(NamedTuple):
    module: str
    node: ast.ClassDef
    owns: frozenset[str]  # what it defines: methods, class attributes, ``self._x = ...``


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in _STDLIB_PRIVATES


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "super"


def _private_use(node: ast.AST) -> tuple[ast.AST, str] | None:
    """``(x, "_a")`` for ``x._a`` and for ``getattr(x, "_a")`` (setattr, hasattr, delattr)."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def _in_class(cls: ast.ClassDef) -> Iterator[ast.AST]:
    """The nodes of ``cls``'s body, its nested classes left out (their ``self`` is another)."""
    todo: list[ast.AST] = list(cls.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))


def _names_defined(body: list[ast.stmt]) -> set[str]:
    """The names a module's or class's body binds: functions, classes, assigned names."""
    names: set[str] = set()
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
    return names


def _owned(cls: ast.ClassDef) -> frozenset[str]:
    owned = _names_defined(cls.body)
    for node in _in_class(cls):
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            targets = []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and _is_self(t.value):
                    owned.add(t.attr)
        use = _private_use(node)
        if use and isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr":
            if _is_self(use[0]):
                owned.add(use[1])
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__":
            args = node.args
            if len(args) >= 2 and _is_self(args[0]) and isinstance(args[1], ast.Constant):
                owned.add(str(args[1].value))
    return frozenset(owned)


@functools.cache
def _classes() -> dict[str, list[_Class]]:
    """Every class of the package by name."""
    index: dict[str, list[_Class]] = {}
    for module, path in NAMES.items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                index.setdefault(node.name, []).append(_Class(module, node, _owned(node)))
    return index


def _base(expr: ast.expr, module: str) -> _Class | None:
    """The package's class that a base ``expr`` written in ``module`` names (None: an outside
    class, torch's or the standard library's, or one that cannot be told)."""
    if isinstance(expr, ast.Subscript):
        expr = expr.value
    parts = ast.unparse(expr).split(".")
    local = {site.local: site for site in _import_sites(NAMES[module]) if site.local}
    site = local.get(parts[0])
    if site is None:
        source, name = module, parts[-1]
    else:
        if site.name is not None:
            origin = f"{site.module}.{site.name}"  # from a import b: the name b
        elif site.local == site.module.split(".")[0]:
            origin = site.local  # import a.b: the name a
        else:
            origin = site.module  # import a.b as c: the name c
        written = ".".join([origin, *parts[1:]])
        if "." not in written:
            return None
        source, name = written.rsplit(".", 1)
        if not _under(source, [ROOT]):
            return None
    candidates = _classes().get(name, [])
    for group in (
        [c for c in candidates if c.module == source],
        [c for c in candidates if c.module.startswith(source + ".")],  # re-exported by a package
        candidates if len(candidates) == 1 else [],
    ):
        if group:
            return group[0]
    return None


def _ancestors(cls: _Class) -> list[_Class]:
    """``cls``'s base classes in the package, nearest first, each once."""
    found: list[_Class] = []
    todo = [cls]
    while todo:
        current = todo.pop(0)
        for expr in current.node.bases:
            base = _base(expr, current.module)
            if base is not None and base is not cls and all(base is not f for f in found):
                found.append(base)
                todo.append(base)
    return found


def _reaches_into_bases(path: Path) -> list[str]:
    """Inside each class of ``path``: ``self._x``, ``cls._x``, ``super()._x``, ``getattr(self,
    "_x")`` and ``def _x`` where ``_x`` is also a base class's, and that base is in another
    module: the subclass is the base class in disguise. Torch's agent hooks are the exception."""
    module = _module_name(path)
    found: dict[str, list[int]] = {}
    for cls in (c for cs in _classes().values() for c in cs if c.module == module):
        foreign = [b for b in _ancestors(cls) if b.module != module]
        if not foreign:
            continue
        uses: list[tuple[str, str, int]] = [
            (f"def {n.name}", n.name, n.lineno)
            for n in cls.node.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        for node in _in_class(cls.node):
            use = _private_use(node)
            if use and (_is_self(use[0]) or _is_super(use[0])):
                uses.append((ast.unparse(node), use[1], getattr(node, "lineno", 0)))
        for shown, attr, line in uses:
            if not _private(attr) or attr in _TORCH_AGENT_HOOKS:
                continue
            if (_name(path), shown) in _PATCHES:
                continue
            owner = next((b for b in foreign if attr in b.owns), None)
            if owner is not None and attr in _DECLARED_HOOKS.get(owner.node.name, ()):
                continue
            if owner is not None:
                what = f"{shown} in {cls.node.name}: {owner.node.name}'s, in {owner.module}"
                found.setdefault(what, []).append(line)
    return [
        f"{what} (line {', '.join(map(str, sorted(set(lines))))})"
        for what, lines in sorted(found.items(), key=lambda item: min(item[1]))
    ]


def _private_imports(path: Path) -> list[str]:
    """``from m import _x`` of another module of the package."""
    return [
        f"from {site.module} import {site.name} (line {site.line})"
        for site in _import_sites(path)
        if site.name is not None and _private(site.name) and _under(site.module, [ROOT])
    ]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_reaches_into_another_objects_private_attributes(path: Path) -> None:
    """``x._name`` (and ``getattr(x, "_name")``) only on ``self``, ``cls``, ``super()`` or the
    module's own classes, and on ``self`` only for what the module's own classes define: a module
    that reads another class's private state, a base class's included, is that class in disguise.
    No ``from m import _name`` from another module either."""
    tree = _tree(path)
    own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    bad = []
    for node in ast.walk(tree):
        use = _private_use(node)
        if use is None or not _private(use[1]):
            continue
        value, attr = use
        if _is_self(value) or _is_super(value):
            continue  # a class of this module's own, or its bases': see _reaches_into_bases
        if isinstance(value, ast.Name) and value.id in own_classes:
            continue
        if _is_same_class_peer(tree, node, attr) or (_name(path), ast.unparse(node)) in _PATCHES:
            continue
        bad.append(f"{ast.unparse(node)} (line {getattr(node, 'lineno', 0)})")
    bad += _private_imports(path) + _reaches_into_bases(path)
    assert not bad, f"{_name(path)}: {bad}"


def _is_same_class_peer(tree: ast.Module, node: ast.AST, attr: str) -> bool:
    """``other._x`` inside a method of a class that defines ``_x`` itself (a peer instance)."""
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if any(n is node for n in ast.walk(cls)):
            return attr in _owned(cls)
    return False


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_every_all_is_complete(path: Path) -> None:
    """``__all__`` holds every public class, function and constant the module defines."""
    defined = _names_defined(ast.parse(path.read_text()).body)
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
    """No concrete handler or backend class (``isinstance`` or a call), no reaching into a
    handler's ``.backend``, no reader of the dynamic handler's keys: reachability, release,
    telemetry, status and close are public calls of the rendezvous (``rendezvous.job`` for a
    reader from outside the job)."""
    tree = ast.parse(path.read_text())
    bad = [
        f"{ast.unparse(n)} (line {n.lineno})"
        for n in ast.walk(tree)
        if (isinstance(n, (ast.Name, ast.Attribute)) and _last(n) in _CONCRETE_RENDEZVOUS)
        or (isinstance(n, ast.Attribute) and n.attr == "backend" and "handler" in ast.unparse(n))
    ]
    bad += [
        f"import {site.module} (line {site.line})"
        for site in _import_sites(path)
        if _under(site.module, ["elastic_run.rendezvous.dynamic"])
        and site.module not in _SEAM_TYPES
    ]
    assert not bad, f"{_name(path)}: {bad}"


_CONCRETE_RENDEZVOUS = {
    "DynamicRendezvousHandler",
    "C10dRendezvousBackend",
    "EtcdRendezvousBackend",
    "EmbeddedEtcdBackend",
}
# The dynamic handler's modules whose types are the seam itself: the telemetry a handler gives.
_SEAM_TYPES = {"elastic_run.rendezvous.dynamic.telemetry"}


def _last(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def test_declared_hooks_are_methods_of_their_class() -> None:
    """Each name of ``_DECLARED_HOOKS`` is a method its class defines (not state)."""
    for name, hooks in _DECLARED_HOOKS.items():
        (cls,) = [c for c in _classes()[name] if c.module.startswith(ROOT)]
        methods = {
            n.name for n in cls.node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        assert hooks <= methods, (name, hooks - methods)


# What a view (cli/views/) may import: rich, the snapshots and events it draws, the failure
# records and console plumbing, the rendezvous API's types and the live feed's picture. Never
# a store, a backend, psutil, a process or socket API, nor the agent's judging parts.
_VIEW_FORBIDDEN = (
    "psutil",
    "socket",
    "subprocess",
    "elastic_run.agent.progress",
    "elastic_run.agent.rules",
    "elastic_run.agent.loop.simple",
    "elastic_run.agent.local",
    "elastic_run.rendezvous.c10d",
    "elastic_run.rendezvous.etcd",
    "elastic_run.rendezvous.dynamic",
    "elastic_run.rendezvous.embedded",
    "elastic_run.rendezvous.job",
    "elastic_run.cli.status",
    "elastic_run.cli.status_pictures",
)
VIEWS = sorted((PACKAGE / "cli" / "views").glob("*.py"))


@pytest.mark.parametrize("path", VIEWS, ids=_name)
def test_views_import_nothing_that_reads_or_judges(path: Path) -> None:
    bad = sorted(m for m in _imports(path) if _under(m, _VIEW_FORBIDDEN))
    assert not bad, f"{_name(path)} imports {bad}: views read published snapshots only"
