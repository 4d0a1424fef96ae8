"""The rule registry (``agent/rules/registry.py``) is the one list the state machine decides by:
the transition table in the state machine's docstring is the registry, row for row; every rule
module is registered and has its own tests; every rule is pure (no clock read: ``now`` is passed).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from elastic_run.agent.loop import state_machine
from elastic_run.agent.rules.observation import Phase
from elastic_run.agent.rules.registry import RULES, published_events, rules_for

RULES_DIR = Path(__file__).resolve().parents[2] / "elastic_run" / "agent" / "rules"
TESTS = Path(__file__).resolve().parent
# Modules of agent/rules/ that are not rules: the records, the actions, the registry, and the
# models the progress rules judge by.
NOT_RULES = {
    "observation",
    "actions",
    "registry",
    "beats",
    "script_end",
    "step_times",
    "history",
}


def _table(phase: str) -> list[str]:
    doc = state_machine.__doc__ or ""
    block = doc.split(f"(``Phase.{phase}``), first match wins:", 1)[1].split("\n\n", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("phase", [Phase.JOINING, Phase.RUNNING])
def test_the_state_machines_table_is_the_registry_row_for_row(phase: Phase) -> None:
    rows = _table(phase.name)
    assert rows[-1] == "(none)"
    assert rows[:-1] == [rule.code for rule in rules_for(phase)]


def test_rule_codes_are_unique() -> None:
    codes = [rule.code for rule in RULES]
    assert len(codes) == len(set(codes))


def _rule_modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(RULES_DIR).with_suffix("").parts)
        for p in RULES_DIR.rglob("*.py")
        if p.name != "__init__.py" and p.stem not in NOT_RULES
    )


def _imported_by_tests() -> set[str]:
    """Every module the unit tests import, by dotted name (``from a.b import c`` counts for
    ``a.b`` and for ``a.b.c``)."""
    names: set[str] = set()
    for path in TESTS.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("module", _rule_modules())
def test_every_rule_module_is_registered_and_tested(module: str) -> None:
    name = f"elastic_run.agent.rules.{module}"
    registered = {rule.judge.__module__ for rule in RULES}
    assert name in registered, f"{name} defines no registered rule"
    assert name in _imported_by_tests(), f"no unit test imports {name}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_every_rule_is_a_function_of_the_observation_and_now(rule: object) -> None:
    judge = rule.judge  # type: ignore[attr-defined]
    assert list(inspect.signature(judge).parameters) == ["obs", "now_ns"]
    source = inspect.getsource(importlib.import_module(judge.__module__))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
    }
    assert not imported & {"time", "os", "socket", "threading", "psutil", "subprocess"}


def test_what_the_rules_emit_is_published_as_the_registry_says() -> None:
    published = published_events()
    assert {"worker.hung", "straggler", "worker.outlived", "restart"} <= published
