"""One call run on torch's module and on ours, and what came back compared.

``both(rel)`` imports ``torch.distributed.elastic.<rel>`` and ``elastic_run.elastic.<rel>``;
``outcome(call)`` records what a call returned or raised; ``same(theirs, ours)`` holds ours to
torch's: the same value, or an exception that is an instance of torch's type.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

__all__ = ["OURS", "TORCH", "both", "outcome", "same", "torch_module"]

TORCH = "torch.distributed.elastic"
OURS = "elastic_run.elastic"


def torch_module(rel: str) -> ModuleType:
    """torch's ``torch.distributed.elastic.<rel>`` (a missing one fails the test, saying why)."""
    try:
        return importlib.import_module(f"{TORCH}.{rel}")
    except ImportError as exc:  # torch's etcd modules need urllib3 (a dev dependency)
        pytest.fail(f"missing: torch's {rel} cannot be imported: {exc} (scripts/setup.sh)")


def both(rel: str) -> tuple[ModuleType, ModuleType]:
    """(torch's module ``rel``, ours)."""
    return torch_module(rel), importlib.import_module(f"{OURS}.{rel}")


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """``("value", result)`` or ``("raised", exception)``."""
    try:
        return "value", call()
    except Exception as exc:
        return "raised", exc


def same(theirs: tuple[str, Any], ours: tuple[str, Any]) -> None:
    """Ours returned what torch's did, or raised an instance of the type torch's raised."""
    assert theirs[0] == ours[0], (theirs, ours)
    if theirs[0] == "raised":
        assert isinstance(ours[1], type(theirs[1])), (type(ours[1]).__mro__, type(theirs[1]))
    else:
        assert ours[1] == theirs[1], (ours[1], theirs[1])
