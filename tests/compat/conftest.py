"""The compat tests: our public APIs called as torch documents them, against torch's own."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _resource_tracker() -> None:
    """multiprocessing's resource tracker, which a spawned function worker needs, lives as long
    as this process: start it up front, so that it is not a process left behind by whichever
    test starts the first spawned worker."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
