"""The default warm-start mode, decided from the training script's imports (cli/options/warm_default.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_run.cli.options.warm_default import default_warm_start, imported_modules


def _decide(tmp_path: Path, source: str, **kwargs: object) -> tuple[bool, str]:
    (tmp_path / "train.py").write_text(source)
    options: dict[str, object] = {"module": False, "no_python": False, "preload": ()}
    options.update(kwargs)
    return default_warm_start("train.py", cwd=tmp_path, **options)  # type: ignore[arg-type]


def test_imports_are_read_from_every_statement_and_literal_dynamic_import() -> None:
    source = (
        "import os, torch.distributed as dist\n"
        "from lightning.pytorch import Trainer\n"
        "from . import sibling\n"
        "def f():\n    import numpy\n"
        "m = __import__('accelerate.utils')\n"
        "n = importlib.import_module('transformers')\n"
        "o = importlib.import_module(name)\n"
    )
    assert imported_modules(source) == {
        "os", "torch", "lightning", ".", "numpy", "accelerate", "transformers",
    }  # fmt: skip


@pytest.mark.parametrize(
    "source",
    ["import torch\n", "import os\nfrom mypackage.model import Net\n", "from . import x\n"],
)
def test_a_script_that_imports_anything_outside_the_standard_library_starts_warm(
    tmp_path: Path, source: str
) -> None:
    warm, why = _decide(tmp_path, source)
    assert warm, why
    assert why.startswith("default: on")


@pytest.mark.parametrize("source", ["import os, sys, json\nprint(os.environ['RANK'])\n", "pass\n"])
def test_a_standard_library_script_starts_cold(tmp_path: Path, source: str) -> None:
    warm, why = _decide(tmp_path, source)
    assert not warm
    assert why == "default: off (the script imports only the standard library)"


def test_an_unreadable_or_unparsable_script_starts_cold(tmp_path: Path) -> None:
    assert _decide(tmp_path, "def broken(:\n")[0] is False
    warm, why = default_warm_start(
        "missing.py", module=False, no_python=False, preload=(), cwd=tmp_path
    )
    assert (warm, why) == (False, "default: off (the script could not be read as Python)")


def test_no_python_preload_and_modules(tmp_path: Path) -> None:
    assert _decide(tmp_path, "import torch\n", no_python=True)[0] is False
    assert _decide(tmp_path, "import os\n", preload=("numpy",))[0] is True
    cold = default_warm_start("json.tool", module=True, no_python=False, preload=(), cwd=tmp_path)
    warm = default_warm_start("mypkg.train", module=True, no_python=False, preload=(), cwd=tmp_path)
    assert (cold[0], warm[0]) == (False, True)
