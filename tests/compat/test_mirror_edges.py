"""Public calls of the mirror at their edges, side by side with torch's: bad paths, odd values.

Each test makes the same call on torch's object and on ours and compares the outcome: the same
value, or an exception of torch's type (ours may be a subclass: our errors are also our own
``ConfigurationError``/``ValueError`` where they were before). The differences kept on purpose
are rows of the README's "Python API" table.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from side_by_side import OURS, TORCH, both, outcome, same


def test_a_log_dir_that_is_a_file_is_torchs_not_a_directory_error(tmp_path: Path) -> None:
    theirs, ours = both("multiprocessing")
    regular = tmp_path / "regular"
    regular.write_text("")
    outcomes = [
        outcome(lambda s=side: s.DefaultLogsSpecs(log_dir=str(regular))) for side in (theirs, ours)
    ]
    same(*outcomes)
    assert outcomes[0][0] == "raised"
    assert isinstance(outcomes[1][1], ValueError)  # as ours raised before, for its callers


def test_a_file_timer_server_in_a_missing_directory_is_torchs_file_not_found(
    tmp_path: Path,
) -> None:
    theirs, ours = both("timer")
    path = str(tmp_path / "missing" / "watchdog")

    def start(side: ModuleType) -> Callable[[], None]:
        def call() -> None:
            server = side.FileTimerServer(path, "edges")  # torch's makes its FIFO here
            server.start()  # ours, here
            server.stop()

        return call

    outcomes = [outcome(start(theirs)), outcome(start(ours))]
    same(*outcomes)
    assert outcomes[0][0] == "raised"
    assert isinstance(outcomes[1][1], ValueError)


@pytest.mark.parametrize(
    "text",
    [
        "0",
        "3",
        "0:1,1:2",
        "0:",
        "4",
        "x",
        "",
    ],
)
def test_std_from_str_as_torchs(text: str) -> None:
    theirs, ours = both("multiprocessing")
    same(outcome(lambda: theirs.Std.from_str(text)), outcome(lambda: ours.Std.from_str(text)))


def _static_handler(root: str) -> Any:
    """A one-node static handler of ``root``'s (built without connecting)."""
    rendezvous = importlib.import_module(f"{root}.rendezvous")
    registry = importlib.import_module(f"{root}.rendezvous.registry")
    params = rendezvous.RendezvousParameters("static", "127.0.0.1:1", "edges", 1, 1, rank="0")
    return registry.get_rendezvous_handler(params)


@pytest.mark.parametrize("entrypoint", [sys.executable, "train.py", "bin/train", len])
def test_get_entrypoint_name_is_torchs(entrypoint: Any) -> None:
    names = []
    for root in (TORCH, OURS):
        api = importlib.import_module(f"{root}.agent.server.api")
        spec = api.WorkerSpec(
            role="t", local_world_size=1, rdzv_handler=_static_handler(root), entrypoint=entrypoint
        )
        names.append(outcome(spec.get_entrypoint_name))
    same(*names)


def test_the_error_handler_modules_are_torchs() -> None:
    sides = [
        (
            importlib.import_module(f"{root}.multiprocessing.errors"),
            importlib.import_module(f"{root}.multiprocessing.errors.error_handler"),
            importlib.import_module(f"{root}.multiprocessing.errors.handlers"),
        )
        for root in (TORCH, OURS)
    ]
    facts = [
        (
            error_handler.ErrorHandler is errors.ErrorHandler,
            handlers.get_error_handler is errors.get_error_handler,
            type(handlers.get_error_handler()).__name__,
        )
        for errors, error_handler, handlers in sides
    ]
    assert facts[1] == facts[0]


def test_event_metadata_value_is_torchs() -> None:
    for rel in ("events", "events.api"):
        theirs, ours = both(rel)
        assert ours.EventMetadataValue == theirs.EventMetadataValue
