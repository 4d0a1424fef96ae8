"""Which worker commands and environments a zygote may start: ``warm_command``, ``env_mismatch``."""

from __future__ import annotations

import os

import pytest

from elastic_run.agent.warm.zygote import WarmCommand, env_mismatch, warm_command

PY = "/usr/bin/python3"


def test_a_script_runs_with_its_directory_first_on_the_path() -> None:
    cwd = "/work/job"
    assert warm_command([PY, "-u", "train.py", "--lr", "1"], PY, cwd) == WarmCommand(
        argv=("train.py", "--lr", "1"),
        module=False,
        unbuffered=True,
        path0=os.path.realpath("/work/job"),
    )


def test_a_module_runs_with_the_cwd_first_on_the_path() -> None:
    assert warm_command([PY, "-u", "-m", "pkg.train", "x"], PY, "/w") == WarmCommand(
        argv=("pkg.train", "x"), module=True, unbuffered=True, path0="/w"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["/bin/true"],  # --no-python
        ["/other/python", "-u", "t.py"],  # another interpreter
        [PY, "-u", "-c", "print(1)"],
        [PY, "-X", "dev", "t.py"],
        [PY, "-u"],
        [],
    ],
)
def test_anything_else_starts_cold_with_a_reason(argv: list[str]) -> None:
    reason = warm_command(argv, PY, "/w")
    assert isinstance(reason, str) and reason


def test_only_per_worker_variables_may_differ_from_the_zygote() -> None:
    zygote = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    worker = {
        **zygote,
        "RANK": "3",
        "LOCAL_RANK": "1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_ERROR_FILE": "/tmp/e.json",
        "ELASTIC_RUN_PROGRESS_FILE": "/dev/shm/x",
    }
    assert env_mismatch(zygote, worker) == []
    assert env_mismatch(zygote, {**worker, "OMP_NUM_THREADS": "4"}) == ["OMP_NUM_THREADS"]
    # Read at CUDA's initialization, after the fork: per worker (--virtual-local-rank).
    assert env_mismatch(zygote, {**worker, "CUDA_VISIBLE_DEVICES": "0"}) == []
    assert env_mismatch(zygote, {**worker, "PYTHONHASHSEED": "0"}) == ["PYTHONHASHSEED"]
    assert env_mismatch({**zygote, "GONE": "1"}, worker) == ["GONE"]
