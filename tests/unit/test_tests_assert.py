"""Every test function checks something: a test that asserts nothing passes without testing.

An AST scan of ``tests/``. A test function (``test_*``, methods of test classes included) checks
something when its body holds, outside any function it defines:

- an ``assert`` statement or ``raise AssertionError``;
- ``pytest.raises``, ``pytest.warns`` or ``pytest.fail``;
- a call of a function of ``tests/`` (a nested function, a helper, another test) every
  definition of whose name checks something by these same rules; a helper of ``tests/`` named
  ``assert_*``, ``expect_*``, ``check_*`` (leading underscores allowed) or ``wait_until`` checks
  when it raises anything (``TimeoutError`` fails a test as well as ``AssertionError``).

Calls are matched by name (``f(...)`` and ``module.f(...)`` alike); a name defined twice counts
only when both definitions check. A function of the product is never a check by its name alone:
``check_endpoint_ports(x)`` with nothing asserted on what it returns tests only that it does not
raise.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
_HELPER = re.compile(r"_*(assert|expect|check)_\w*|wait_until")
_PYTEST_CHECKS = {"raises", "warns", "fail"}

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _own_nodes(function: FunctionNode) -> Iterable[ast.AST]:
    """The nodes of ``function``'s body, not those of functions or lambdas defined in it."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    stack = [n for n in (*function.body, *function.decorator_list) if not isinstance(n, nested)]
    while stack:
        node = stack.pop()
        yield node
        stack += [c for c in ast.iter_child_nodes(node) if not isinstance(c, nested)]


def _checks_directly(node: ast.AST, helper: bool) -> bool:
    """Whether ``node`` is a check; in a helper (named as one), any ``raise`` is."""
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Raise) and node.exc is not None:
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return helper or (isinstance(raised, ast.Name) and raised.id == "AssertionError")
    if isinstance(node, ast.Call):
        return (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "pytest"
            and node.func.attr in _PYTEST_CHECKS
        )
    return False


def functions_that_check(trees: Iterable[ast.Module]) -> tuple[list[FunctionNode], set[str]]:
    """Every function of ``trees``, and the names all of whose definitions check something.

    Returns:
        (every function definition, the names that check: see the module docstring).
    """
    functions = [
        node
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    by_name: dict[str, list[FunctionNode]] = {}
    for function in functions:
        by_name.setdefault(function.name, []).append(function)
    calls = {
        id(f): {
            name
            for node in _own_nodes(f)
            if isinstance(node, ast.Call) and (name := _called_name(node)) is not None
        }
        for f in functions
    }
    checking = {
        id(f)
        for f in functions
        if any(_checks_directly(n, _HELPER.fullmatch(f.name) is not None) for n in _own_nodes(f))
    }
    while True:
        names = {n for n, defs in by_name.items() if all(id(d) in checking for d in defs)}
        more = {id(f) for f in functions if id(f) not in checking and calls[id(f)] & names}
        if not more:
            return functions, names
        checking |= more


def unchecked_tests(sources: dict[str, str]) -> list[str]:
    """The test functions of ``sources`` (path -> text) that check nothing, as ``path:line name``."""
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    _, checking = functions_that_check(trees.values())
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("test") and node.name not in checking:
                    found.append(f"{path}:{node.lineno} {node.name}")
    return sorted(found)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(TESTS.parent)): p.read_text() for p in sorted(TESTS.rglob("*.py"))}


def test_every_test_function_checks_something() -> None:
    assert unchecked_tests(_sources()) == []


# ---- the scan itself: what counts as a check, and what does not ----------------------------

_CHECKS = {
    "assert": "def test_x():\n    assert f() == 1\n",
    "raise AssertionError": "def test_x():\n    if f():\n        raise AssertionError('no')\n",
    "pytest.raises": "def test_x():\n    with pytest.raises(ValueError):\n        f()\n",
    "pytest.fail": "def test_x():\n    if f():\n        pytest.fail('no')\n",
    "assert_ helper": (
        "def assert_ok(v):\n    if not v:\n        raise ValueError(v)\n\n"
        "def test_x():\n    assert_ok(f())\n"
    ),
    "wait_until": (
        "def wait_until(p, s):\n    if not p():\n        raise TimeoutError(s)\n\n"
        "def test_x():\n    helpers.wait_until(f, 5)\n"
    ),
    "a helper that asserts": "def ok(v):\n    assert v\n\ndef test_x():\n    ok(f())\n",
    "another test": "def test_a():\n    assert f()\n\ndef test_x():\n    mod.test_a()\n",
    "a called nested function": (
        "def test_x():\n    def walk(n):\n        assert n\n    walk(f())\n"
    ),
}
_NO_CHECKS = {
    "a bare call": "def test_x():\n    f()\n",
    "an exception swallowed": (
        "def test_x():\n    try:\n        f()\n    except ValueError:\n        pass\n"
    ),
    "a nested function never called": "def test_x():\n    def g():\n        assert f()\n",
    "a helper without a check": "def run(v):\n    return v\n\ndef test_x():\n    run(f())\n",
    "a name defined twice, once without a check": (
        "def ok(v):\n    assert v\n\ndef test_x():\n    ok(f())\n",
        "def ok(v):\n    return v\n",
    ),
    "assert in a lambda never called": "def test_x():\n    g = lambda: f()\n",
    "an unrelated pytest call": "def test_x():\n    pytest.param(f())\n",
    "a product function named check_": "def test_x():\n    check_ports(f())\n",
    "a raise in a test's own helper not named as one": (
        "def run(v):\n    if not v:\n        raise ValueError(v)\n\ndef test_x():\n    run(f())\n"
    ),
}


@pytest.mark.parametrize("source", _CHECKS.values(), ids=list(_CHECKS))
def test_the_scan_counts_each_kind_of_check(source: str) -> None:
    assert unchecked_tests({"t.py": source}) == []


@pytest.mark.parametrize("sources", _NO_CHECKS.values(), ids=list(_NO_CHECKS))
def test_the_scan_finds_a_test_that_checks_nothing(sources: str | tuple[str, ...]) -> None:
    texts = (sources,) if isinstance(sources, str) else sources
    found = unchecked_tests({f"t{i}.py": text for i, text in enumerate(texts)})
    assert found == ["t0.py:" + str(texts[0].splitlines().index("def test_x():") + 1) + " test_x"]
