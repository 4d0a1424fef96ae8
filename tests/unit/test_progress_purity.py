"""The progress cores are pure like the other decision modules (the same check as
``test_layering.py``'s, for the modules issue 17 added: the lead may fold them into its list)."""

from __future__ import annotations

import pytest

from tests.unit.test_layering import IMPURE_MODULES, PACKAGE, _imports

PURE_PROGRESS = [
    "elastic_run/agent/progress/stack_report.py",
    "elastic_run/agent/progress/config.py",
]


@pytest.mark.parametrize("rel", PURE_PROGRESS)
def test_the_progress_cores_import_no_io(rel: str) -> None:
    imported = {name.split(".")[0] for name in _imports(PACKAGE.parent / rel)}
    assert not imported & IMPURE_MODULES, (rel, imported & IMPURE_MODULES)


def test_the_worker_side_beat_file_imports_nothing_of_the_agent() -> None:
    imported = _imports(PACKAGE / "worker" / "beat_file.py")
    assert not [m for m in imported if m.startswith(("elastic_run.", "torch"))], imported
