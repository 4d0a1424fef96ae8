"""elastic-run on a real two-node Slurm (issue 8): the batch files in scripts/slurm/ train the
demo across both nodes with ``srun elastic-run``; SIGUSR1 sent to the job reaches the workers;
``elastic-run status/close --slurm-job`` work from "the login node".

The cluster is the ``slurm_cluster`` fixture (nodes 127.0.0.1 and 127.0.0.2, see
slurm_cluster.py); every test skips with the reason where this machine cannot run Slurm.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, wait_until
from slurm_fixtures import slurm_cluster  # noqa: F401  (the fixture)

from tests.helpers import WaitTimeout

REPO_ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = REPO_ROOT / "scripts" / "slurm"
VENV = Path(sys.prefix)
ELASTIC_RUN = VENV / "bin" / "elastic-run"
USR1_WORKER = Path(__file__).resolve().parent / "slurm_scripts" / "usr1_worker.py"

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(150)]

# "round 0 complete: node 1 of 2, ranks 2..3 of 4" (the agent's rendezvous.complete event)
ROUND_RE = re.compile(
    r"round (?P<round>\d+) complete: node (?P<node>\d+) of (?P<nodes>\d+), "
    r"ranks (?P<first>\d+)\.\.(?P<last>\d+) of (?P<world>\d+)"
)


def _job_env(tmp_path: Path, nproc: int, **extra: str) -> dict[str, str]:
    """The environment the batch files document, for a job writing under ``tmp_path``, its
    temp folder too (``tmp_path/job-tmp``: the agents' default log folders go there)."""
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir(exist_ok=True)
    return {
        "TMPDIR": str(job_tmp),
        "ELASTIC_RUN_REPO": str(REPO_ROOT),
        "ELASTIC_RUN_VENV": str(VENV),
        "NPROC": str(nproc),
        "CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        **extra,
    }


def _rounds(output: str) -> list[dict[str, int]]:
    return [
        {key: int(value) for key, value in match.groupdict().items()}
        for match in ROUND_RE.finditer(output)
    ]


def _assert_trained_on_both_nodes(output: str, nproc: int, steps: int) -> None:
    """Both agents completed the same round as the two nodes of a 2*nproc world; rank 0
    printed the final line."""
    rounds = _rounds(output)
    assert len(rounds) == 2, output
    assert {r["round"] for r in rounds} == {rounds[0]["round"]}, output
    assert sorted(r["node"] for r in rounds) == [0, 1], output
    assert {(r["nodes"], r["world"]) for r in rounds} == {(2, 2 * nproc)}, output
    assert sorted((r["first"], r["last"]) for r in rounds) == [
        (0, nproc - 1),
        (nproc, 2 * nproc - 1),
    ], output
    assert re.search(rf"^.*done: steps={steps} final_loss=[0-9.]+", output, re.M), output


def test_multi_node_c10d_batch_file_trains_across_both_nodes(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    nproc, steps = 2, 20
    code, job_id = slurm_cluster.sbatch(
        SLURM_DIR / "multi-node-c10d.sbatch",
        "--log-every",
        "10",
        env=_job_env(tmp_path, nproc, STEPS=str(steps)),
        timeout_s=100,
    )
    output = slurm_cluster.output_of(job_id)
    assert code == 0, output
    _assert_trained_on_both_nodes(output, nproc, steps)
    final = json.loads((tmp_path / "checkpoints" / "final.json").read_text())
    assert (final["steps"], final["world_size"]) == (steps, 2 * nproc), final


@pytest.mark.etcd
@pytest.mark.usefixtures("etcd_binary")  # fails the test when etcd is missing
def test_multi_node_etcd_batch_file_trains_across_both_nodes(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    nproc, steps = 1, 20
    port = _free_port()
    code, job_id = slurm_cluster.sbatch(
        SLURM_DIR / "multi-node-etcd.sbatch",
        "--log-every",
        "10",
        env=_job_env(tmp_path, nproc, STEPS=str(steps), ETCD_PORT=str(port)),
        timeout_s=100,
    )
    output = slurm_cluster.output_of(job_id)
    assert code == 0, output
    _assert_trained_on_both_nodes(output, nproc, steps)
    # The batch file stopped `elastic-run etcd` with a SIGTERM it handles (not through srun,
    # which SIGKILLs the step): its 123 MB data folder is gone with the job.
    assert not list((tmp_path / "job-tmp").glob("elastic-run-etcd-*")), output


@pytest.mark.etcd
@pytest.mark.usefixtures("etcd_binary")  # fails the test when etcd is missing
def test_sigusr1_does_not_stop_the_etcd_job(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    # SIGUSR1 (what --signal=USR1@60 sends) reaches every process of every step, the
    # `elastic-run etcd` step too: the job's store must stay up and the training go on.
    nproc, steps = 1, 30
    _, job_id = slurm_cluster.sbatch(
        SLURM_DIR / "multi-node-etcd.sbatch",
        "--log-every",
        "1",
        "--sleep-per-step",
        "0.1",
        "--handle-usr1",
        wait=False,
        env=_job_env(tmp_path, nproc, STEPS=str(steps), ETCD_PORT=str(_free_port())),
    )
    try:
        wait_until(
            # A hang guard: two agents, an etcd step and two workers import torch on 2 loaded
            # cores (a whole check once took 36 s to form the round and 60 s did not suffice).
            lambda: "step 3/" in slurm_cluster.output_of(job_id),
            120,
            f"job {job_id} to train",
        )
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}\n{slurm_cluster.output_of(job_id)}") from exc
    slurm_cluster.run_client(["scancel", "--signal=USR1", job_id])
    _wait_job_end(slurm_cluster, job_id, 60)
    output = slurm_cluster.output_of(job_id)
    assert "got SIGUSR1" in output, output
    assert "cannot be reached" not in output, output  # the store stayed up
    assert output.count("agent exits with code 0") == 2, output
    final = json.loads((tmp_path / "checkpoints" / "final.json").read_text())
    assert (final["steps"], final["world_size"]) == (steps, 2 * nproc), final


def test_sigusr1_sent_to_the_job_reaches_the_workers_which_keep_running(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    script = tmp_path / "usr1.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --cpus-per-task=2\n"
        f"srun {ELASTIC_RUN} --nproc-per-node 1 --max-restarts 0 "
        f"--signals-to-handle SIGTERM,SIGINT,SIGUSR1 {USR1_WORKER} {markers}\n"
        'echo "srun exited with $?"\n'
    )
    _, job_id = slurm_cluster.sbatch(script, wait=False)
    ranks = ("0", "1")
    try:
        wait_until(
            lambda: all((markers / f"ready-{rank}").exists() for rank in ranks),
            60,
            f"job {job_id}'s workers to install their SIGUSR1 handlers",
        )
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}\n{slurm_cluster.output_of(job_id)}") from exc
    # Without --batch/--full, scancel signals every task of every step: the agents, which
    # forward SIGUSR1 to their workers.
    slurm_cluster.run_client(["scancel", "--signal=USR1", job_id])
    wait_until(
        lambda: all((markers / f"usr1-{rank}").exists() for rank in ranks),
        30,
        f"job {job_id}'s workers to see SIGUSR1",
    )
    assert job_id in slurm_cluster.job_ids(), slurm_cluster.output_of(job_id)
    (markers / "go").touch()
    _wait_job_end(slurm_cluster, job_id, 60)
    output = slurm_cluster.output_of(job_id)
    for rank in ranks:
        ready_pid = (markers / f"ready-{rank}").read_text().split()[0]
        assert (markers / f"usr1-{rank}").read_text().split()[0] == ready_pid
        # The same worker process finished, in the first attempt: nothing was restarted.
        assert (markers / f"done-{rank}").read_text().split() == [ready_pid, "0"], output
    assert "srun exited with 0" in output, output
    # Each agent forwarded it (Slurm also signals every process of the step directly, the
    # agent's helpers included: the worker guardian must survive that).
    assert output.count("forwarded SIGUSR1 to the workers") == 2, output
    assert "guardian" not in output, output


def test_status_and_close_from_the_login_node(
    slurm_cluster: SlurmCluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nproc = 1
    _, job_id = slurm_cluster.sbatch(
        SLURM_DIR / "multi-node-c10d.sbatch",
        "--sleep-per-step",
        "0.2",
        "--log-every",
        "1",
        wait=False,
        env=_job_env(tmp_path, nproc, STEPS="600"),
    )
    try:
        wait_until(lambda: len(_rounds(slurm_cluster.output_of(job_id))) == 2, 60, "a round")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}\n{slurm_cluster.output_of(job_id)}") from exc

    # "The login node": SLURM_CONF names the cluster, and nothing else of the job.
    login_env = slurm_cluster.env
    status = subprocess.run(
        [str(ELASTIC_RUN), "status", "--slurm-job", job_id, "--json", "--sample", "0"],
        capture_output=True,
        text=True,
        env=login_env,
        timeout=90,  # a hang guard: the status command imports torch, slow under a loaded run
        check=False,
    )
    assert status.returncode == 0, status.stderr + slurm_cluster.output_of(job_id)
    snapshot = json.loads(status.stdout)
    assert len(snapshot["members"]) == 2, snapshot
    assert snapshot["run_id"] == f"{job_id}-0", snapshot

    # A hang guard past --timeout: the wait's last window may end one window (15 s with the
    # default 5 s heartbeat) after it, and the command imports torch first.
    try:
        close = subprocess.run(
            [str(ELASTIC_RUN), "close", "--slurm-job", job_id, "--wait", "--timeout", "30"],
            capture_output=True,
            text=True,
            env=login_env,
            timeout=90,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{exc}: {exc.stderr!r}\n{slurm_cluster.output_of(job_id)}") from exc
    assert close.returncode == 0, close.stderr + slurm_cluster.output_of(job_id)
    _wait_job_end(slurm_cluster, job_id, 30)
    output = slurm_cluster.output_of(job_id)
    assert "done: steps=" not in output, output  # closed, not finished
    # 3: the rendezvous was closed, on both nodes (the store's host leaves last).
    assert output.count("agent exits with code 3") == 2, output


def _wait_job_end(cluster: SlurmCluster, job_id: str, timeout_s: float) -> None:
    """Wait until the job left the queue; fail with its output if it does not."""
    try:
        wait_until(lambda: job_id not in cluster.job_ids(), timeout_s, f"job {job_id} to end")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}\n{cluster.output_of(job_id)}") from exc


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
