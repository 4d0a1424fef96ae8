"""torch.distributed.run's helpers beside ``elastic_run.run``'s, and the ``--rdzv-conf`` split.

``parse_min_max_nnodes`` and ``determine_local_world_size`` are called the same way on torch's
module and on ours: the same answer, or an exception that is an instance of torch's type (where
torch's accepts a value ours refuses, the docs' table says so). The ``--rdzv-conf`` text is split
by torch's launcher parse and by ours into the same pairs (quotes included, as torchrun passes
them on), and refused where torch's refuses it. ``main`` runs the command in the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from side_by_side import outcome, same

import elastic_run.run as ours
from elastic_run.cli.options.rdzv_conf import parse_rdzv_conf
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def theirs() -> object:
    import torch.distributed.run

    return torch.distributed.run


@pytest.mark.parametrize("nnodes", ["1", "2:20", " 3 ", "4:4", "2:20:30", "x", "1:x", ""])
def test_parse_min_max_nnodes_as_torchs(theirs: object, nnodes: str) -> None:
    same(
        outcome(lambda: theirs.parse_min_max_nnodes(nnodes)),  # type: ignore[attr-defined]
        outcome(lambda: ours.parse_min_max_nnodes(nnodes)),
    )


@pytest.mark.parametrize("nnodes", ["0", "0:2", "3:2"])
def test_node_counts_torchs_helper_accepts_are_value_errors(theirs: object, nnodes: str) -> None:
    """A documented difference: torch's returns them; the launcher would fail on them later."""
    assert outcome(lambda: theirs.parse_min_max_nnodes(nnodes))[0] == "value"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="--nnodes"):
        ours.parse_min_max_nnodes(nnodes)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.parametrize("nproc", ["4", " 2", "cpu", "auto", "gpu", "xpu", "bogus", "1.5", ""])
def test_determine_local_world_size_as_torchs(theirs: object, nproc: str) -> None:
    if nproc == "auto" and _has_cuda():
        pytest.skip("torch's auto counts any accelerator; this host has CUDA")
    same(
        outcome(lambda: theirs.determine_local_world_size(nproc)),  # type: ignore[attr-defined]
        outcome(lambda: ours.determine_local_world_size(nproc)),
    )


@pytest.mark.parametrize("nproc", ["0", "-1"])
def test_worker_counts_torchs_helper_accepts_are_value_errors(theirs: object, nproc: str) -> None:
    assert outcome(lambda: theirs.determine_local_world_size(nproc))[0] == "value"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="--nproc-per-node"):
        ours.determine_local_world_size(nproc)


def test_cpu_counts_the_cpus_this_process_may_run_on_as_torchs() -> None:
    """``--nproc-per-node cpu`` under a narrowed affinity (taskset, a cpuset): one worker per CPU
    the process was given, on both."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = (
        "import json, os, sys; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "import torch.distributed.run as t, elastic_run.run as o; "
        "print(json.dumps([t.determine_local_world_size('cpu'), "
        "o.determine_local_world_size('cpu'), os.cpu_count()]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs_n, ours_n, _ = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs_n == ours_n == 1


RDZV_CONFS = [
    "",
    "a=1",
    " a = 1 ,b=2, a=3",
    "'join_timeout=5,last_call_timeout=1,timeout=5'",  # torch's own test passes it quoted
    "timeout=5'",
    "a=b=c",
    "k=",
    "a=1,k= ",
    "k",
    "=v",
    "a=1,,b=2",
]


@pytest.mark.parametrize("text", RDZV_CONFS)
def test_rdzv_conf_splits_as_torchruns(text: str) -> None:
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    theirs = outcome(lambda: _parse_rendezvous_config(text))
    mine = outcome(lambda: dict(parse_rdzv_conf(text)))
    same(theirs, mine)


def _run_main(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\nfrom elastic_run.run import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as exc:\n"
        "    print('exit', exc.code)\n    raise\nprint('returned')\n"
    )
    env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=cwd,
        env=env,
    )


def test_main_returns_when_the_job_succeeded_and_exits_with_the_code_otherwise(
    tmp_path: Path,
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(
        "import os, pathlib, torch.distributed as d\n"
        "pathlib.Path(os.environ['OUT'], os.environ['RANK']).write_text("
        "str(d.is_torchelastic_launched()))\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    ran = _run_main(["--standalone", "--nproc-per-node", "1", str(script)], tmp_path, OUT=str(out))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip().splitlines()[-1] == "returned"
    assert (out / "0").read_text() == "True"  # torch.distributed.is_torchelastic_launched()
    bad = _run_main(["--rdzv-conf", "k=", str(script)], tmp_path)
    assert bad.returncode == 2 and "exit 2" in bad.stdout
    assert bad.stderr.strip().splitlines() == ["Error: --rdzv-conf 'k=': 'k' has no value"]
