"""The test Slurm itself: multi-node jobs, signals, clean tear-down; and SLURM awareness in a
real job step (slurm_defaults, should_exit_as_extra_task, rdzv_from_slurm_job)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest
from slurm_cluster import SlurmCluster, wait_until
from slurm_fixtures import require_slurm, slurm_cluster  # noqa: F401  (the fixture)

from elastic_run.cli.slurm.allocation import rdzv_from_slurm_job
from tests.helpers import WaitTimeout

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body.lstrip("\n"))
    path.chmod(0o755)
    return path


def test_two_node_job_runs_one_task_per_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    script = _script(
        tmp_path / "hosts.sbatch",
        """
#SBATCH -N2
#SBATCH --ntasks-per-node=1
echo "nodelist=$SLURM_JOB_NODELIST"
srun bash -c 'echo "task nodeid=$SLURM_NODEID localid=$SLURM_LOCALID node=$SLURMD_NODENAME"'
""",
    )
    code, job_id = slurm_cluster.sbatch(script)
    output = slurm_cluster.output_of(job_id)
    assert code == 0, output
    assert "nodelist=127.0.0.[1-2]" in output
    tasks = sorted(line for line in output.splitlines() if line.startswith("task "))
    assert tasks == [
        "task nodeid=0 localid=0 node=127.0.0.1",
        "task nodeid=1 localid=0 node=127.0.0.2",
    ], output


def test_sbatch_wait_returns_the_job_exit_code(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    script = _script(tmp_path / "fail.sbatch", "#SBATCH -N1\nsrun bash -c 'exit 7'\n")
    code, job_id = slurm_cluster.sbatch(script)
    assert code == 7, slurm_cluster.output_of(job_id)


def test_scancel_signal_reaches_a_trapping_task(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    ready = tmp_path / "ready"
    record = tmp_path / "got-signal"
    script = _script(
        tmp_path / "trap.sbatch",
        f"""
#SBATCH -N1
srun bash -c 'trap "echo USR1 > {record}; exit 0" USR1
touch {ready}
for _ in $(seq 600); do sleep 0.1; done
exit 9'
""",
    )
    _, job_id = slurm_cluster.sbatch(script, wait=False)
    wait_until(ready.exists, 60, f"job {job_id} to start its task")
    slurm_cluster.run_client(["scancel", "--signal=USR1", job_id])
    wait_until(lambda: job_id not in slurm_cluster.job_ids(), 60, f"job {job_id} to end")
    assert record.read_text().strip() == "USR1", slurm_cluster.output_of(job_id)


def test_sbatch_signal_option_sends_usr1_before_the_time_limit(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    # --signal=USR1@60 with a 1-minute limit: due at once; slurmctld sends it on its
    # next periodic check, well within the limit.
    record = tmp_path / "got-signal"
    script = _script(
        tmp_path / "timed.sbatch",
        f"""
#SBATCH -N1
#SBATCH --time=1
#SBATCH --signal=USR1@60
srun bash -c 'trap "echo USR1 > {record}; exit 0" USR1
for _ in $(seq 1200); do sleep 0.1; done
exit 9'
""",
    )
    code, job_id = slurm_cluster.sbatch(script, timeout_s=100)
    assert code == 0, slurm_cluster.output_of(job_id)
    assert record.read_text().strip() == "USR1"


def test_slurm_awareness_inside_a_real_step(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os\n"
        "from elastic_run.cli.slurm.allocation import should_exit_as_extra_task, slurm_defaults\n"
        "notice = should_exit_as_extra_task(os.environ)\n"
        "chosen = slurm_defaults(os.environ, given={}, elastic_min=None)\n"
        "print('PROBE ' + json.dumps({'node': os.environ['SLURMD_NODENAME'],\n"
        "    'localid': os.environ['SLURM_LOCALID'], 'notice': notice,\n"
        "    'defaults': {d.name: d.value for d in chosen}}), flush=True)\n"
    )
    ready = tmp_path / "ready"
    go = tmp_path / "go"
    script = _script(
        tmp_path / "aware.sbatch",
        f"""
#SBATCH -N2
#SBATCH --ntasks-per-node=2
srun {sys.executable} {probe}
srun -N1 -n1 bash -c 'touch {ready}; for _ in $(seq 600); do [ -e {go} ] && exit 0; sleep 0.1; done; exit 9'
""",
    )
    _, job_id = slurm_cluster.sbatch(script, wait=False, env={"PYTHONPATH": str(REPO_ROOT)})
    wait_until(ready.exists, 60, f"job {job_id} to reach its second step")

    # From the "login node": the job runs step 1 now.
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf_path))
    assert rdzv_from_slurm_job(job_id) == (f"{job_id}-1", "127.0.0.1:29400")
    assert rdzv_from_slurm_job(f"{job_id}.0") == (f"{job_id}-0", "127.0.0.1:29400")
    go.touch()
    wait_until(lambda: job_id not in slurm_cluster.job_ids(), 60, f"job {job_id} to end")

    output = slurm_cluster.output_of(job_id)
    probes = [json.loads(line[6:]) for line in output.splitlines() if line.startswith("PROBE ")]
    assert len(probes) == 4, output
    expected = {
        "rdzv_id": f"{job_id}-0",
        "nnodes": "2",
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:29400",
    }
    for probe_result in probes:
        assert probe_result["defaults"] == expected
        if probe_result["localid"] == "0":
            assert probe_result["notice"] is None
        else:
            assert "SLURM_LOCALID=1" in probe_result["notice"]
            assert probe_result["node"] in probe_result["notice"]
    assert sorted((p["node"], p["localid"]) for p in probes) == [
        ("127.0.0.1", "0"),
        ("127.0.0.1", "1"),
        ("127.0.0.2", "0"),
        ("127.0.0.2", "1"),
    ]


def test_stop_leaves_no_process_even_with_a_task_ignoring_sigterm(tmp_path: Path) -> None:
    require_slurm()
    marker = f"elastic-run-slurm-test-{os.getpid()}"
    ready = tmp_path / "ready"
    cluster = SlurmCluster(tmp_path / "cluster", nodes=("127.0.0.1",))
    with cluster:
        daemons = [psutil.Process(pid) for pid in cluster.daemon_pids()]
        script = _script(
            tmp_path / "stubborn.sbatch",
            f"#SBATCH -N1\nsrun bash -c 'trap \"\" TERM; touch {ready}; exec -a {marker} sleep 300'\n",
        )
        _, job_id = cluster.sbatch(script, wait=False)
        try:
            wait_until(ready.exists, 60, "the stubborn task to start")
        except WaitTimeout as exc:
            raise AssertionError(
                f"{exc}\n{cluster.output_of(job_id)}\n{cluster.log_tails()}"
            ) from exc
        wait_until(lambda: bool(_marked(marker)), 10, "the marked sleep to run")
    assert not _marked(marker)
    assert not [daemon for daemon in daemons if daemon.is_running()]


def _marked(marker: str) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0] == marker:
            found.append(process)
    return found
