"""Bad nodes, end to end: real agents on 127.0.0.1, a real c10d store, real worker crashes.

- A node whose workers crash at every start (its host is bad: ``MN_BAD_NODE``), three nodes
  ``--nnodes 2:3`` and a spare, ``--max-restarts 3``: that node is suspect after its first
  failure, gets other ranks, fails again, is excluded (exit 6, one line), and the spare takes
  its place; the job completes with exit 0 on the others.
- A rank that fails wherever it runs (``MN_FAIL_RANK``): the failure follows the rank to
  another node, nobody is excluded, the job ends with exit 1 and says the failure followed the
  rank.
- A node beyond MAX (four healthy nodes, ``--nnodes 2:3``): one round of three trains to the
  end, the fourth waits as a spare without ending it, and exits 0 saying it was not needed.

The workers are ``mn_scripts/worker.py`` (they record their environment, then wait for ``go``).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_multinode import FAST_CONF, Job
from tests.helpers import free_port, run_cli_in_process, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(name="job")
def job_fixture(tmp_path: Path) -> Iterator[Job]:
    job = Job(tmp_path, "c10d", f"127.0.0.1:{free_port()}")
    yield job
    job.kill_all()


def _status(job: Job) -> dict[str, Any]:
    """``elastic-run status --json`` of the job (in this process: no torch import per call)."""
    proc = run_cli_in_process(
        ["status", "--rdzv-backend", "c10d", "--rdzv-endpoint", job.endpoint,
         "--rdzv-id", job.run_id, "--json", "--sample", "0"],
        timeout_s=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    body: dict[str, Any] = json.loads(proc.stdout)
    return body


def _events(job: Job, name: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in job.nodes[name].events() if e["kind"] == kind]


def _rounds(job: Job, name: str) -> int:
    return len(_events(job, name, "rendezvous.complete"))


def _start_four_with_a_spare(job: Job) -> tuple[str, list[str], dict[str, int]]:
    """Start a (the store's host), b and c with ``--nnodes 2:3``, wait until the three train,
    then start d, the spare: return it, the members and how many rounds each member completed
    by then. (Before a round formed there is no rendezvous for ``status`` to show: it exits 3.)
    The four started at once made any of them the spare, and a member of a first round of two
    that became the spare said the job finished, not that it waited (a whole check saw it)."""
    members = ["a", "b", "c"]
    for name in members:
        job.start(name, nnodes="2:3", conf=FAST_CONF, host=name == "a")
    job.wait_running(members, 3)
    rounds = {name: _rounds(job, name) for name in members}
    job.start("d", nnodes="2:3", conf=FAST_CONF)
    return "d", members, rounds


def test_a_bad_node_is_excluded_and_a_spare_takes_its_place(job: Job) -> None:
    env = {"MN_BAD_NODE": "c"}
    for name in "abc":
        job.start(
            name, nnodes="2:3", conf=FAST_CONF, host=name == "a", env=env,
            extra=("--max-restarts", "3"),
        )  # fmt: skip
    # The spare comes once the bad node is suspect: it waits at the door of a full round.
    wait_until(
        lambda: "is suspect (1 of 2" in job.nodes["c"].output(), 120,
        message=job.report,
    )  # fmt: skip
    job.start("d", nnodes="2:3", conf=FAST_CONF, env=env, extra=("--max-restarts", "3"))

    assert job.wait_exit("c", 120) == 6, job.report()
    out = job.nodes["c"].output()
    (line,) = [ln for ln in out.splitlines() if "excluded:" in ln and ln.startswith("Error:")]
    assert "root cause of 2 failed rounds with different ranks" in line, out
    assert "SIGSEGV" in line
    (excluded,) = _events(job, "c", "node.excluded")
    suspect = _events(job, "c", "node.suspect")
    assert suspect and suspect[0]["fields"]["failures"] == 1
    # The second failure came with other ranks than the first (the suspect asked for them).
    ranks = [f.split()[1] for f in excluded["fields"]["reason"].split("(", 1)[1].split(";")]
    assert len(set(ranks)) == 2, excluded

    job.wait_running(["a", "b", "d"], 3, timeout_s=120)
    status = _status(job)
    assert any("root cause of 2 failed rounds" in line for line in status["excluded"]), status
    # Each agent's first event names its node as status and the others' records name it.
    started = {n: _events(job, n, "agent.started")[0]["fields"]["node"] for n in "abd"}
    assert sorted(started.values()) == sorted(m["node_id"] for m in status["members"]), status
    job.go()
    for name in "abd":
        assert job.wait_exit(name) == 0, job.report()
    # The restarts the bad node spent count (its two failures); the re-forming after its
    # exclusion does not.
    assert {job.newest(n)["TORCHELASTIC_RESTART_COUNT"] for n in "abd"} == {"2"}, job.report()
    # The others name the excluded node in their summary, and their goodput books what its
    # rounds cost them.
    assert "node excluded during the job" in job.nodes["a"].output(), job.report()
    (goodput,) = _events(job, "a", "goodput")
    assert goodput["fields"]["bad_node_s"] > 0, goodput
    assert "to nodes excluded as unhealthy" in goodput["message"], goodput
    job.assert_no_survivors()


def test_a_failure_that_follows_its_rank_excludes_nobody(job: Job) -> None:
    env = {"MN_FAIL_RANK": "0"}
    for name in "ab":
        job.start(name, nnodes="2", host=name == "a", env=env, extra=("--max-restarts", "2"))
    codes = {name: job.wait_exit(name, 180) for name in "ab"}
    assert codes == {"a": 1, "b": 1}, job.report()
    for name in "ab":
        assert not _events(job, name, "node.excluded"), job.report()
    both = job.nodes["a"].output() + job.nodes["b"].output()
    assert "the failure of rank 0 followed its rank" in both, both
    # rank 0 ran on both nodes: the suspect asked for other ranks, and the rank moved.
    hosts_of_rank0 = {r["node"] for r in job.records() if r["RANK"] == "0"}
    assert hosts_of_rank0 == {"a", "b"}, job.records()
    job.assert_no_survivors()


def test_a_node_beyond_max_waits_as_a_spare_without_ending_the_round(job: Job) -> None:
    spare, members, rounds_then = _start_four_with_a_spare(job)
    seen: dict[str, Any] = {}

    def spare_shown() -> bool:
        seen.update(_status(job))
        return [w.get("health") for w in seen.get("waiting", [])] == ["spare"]

    wait_until(spare_shown, 60, message=lambda: json.dumps(seen)[-2000:])
    assert {m["health"] for m in seen["members"]} == {"ok"}
    job.go()
    for name in members:
        assert job.wait_exit(name) == 0, job.report()
    assert job.wait_exit(spare) == 0, job.report()
    assert "waited as a spare and was not needed" in job.nodes[spare].output()
    # No churn: the spare's arrival formed no round; the members trained on to the end.
    assert {name: _rounds(job, name) for name in members} == rounds_then, job.report()
    job.assert_no_survivors()


def test_a_node_that_fails_its_check_never_joins_and_the_job_runs_at_min(job: Job) -> None:
    """c's own check fails (``--node-check-cmd``: its first line is the reason), d's hangs and
    is cut at ``--node-check-timeout``: neither joins (exit 6, one line), a and b train."""
    job.start("a", nnodes="2:4", conf=FAST_CONF, host=True)
    job.start("b", nnodes="2:4", conf=FAST_CONF)
    job.start(
        "c", nnodes="2:4", conf=FAST_CONF,
        extra=("--node-check-cmd", "echo scratch disk full; exit 1"),
    )  # fmt: skip
    job.start(
        "d", nnodes="2:4", conf=FAST_CONF,
        extra=("--node-check-cmd", "sleep 600", "--node-check-timeout", "2"),
    )  # fmt: skip
    assert job.wait_exit("c", 120) == 6, job.report()
    assert job.wait_exit("d", 120) == 6, job.report()
    (c_line,) = [ln for ln in job.nodes["c"].output().splitlines() if ln.startswith("Error:")]
    assert "failed its node check: scratch disk full" in c_line, c_line
    (d_line,) = [ln for ln in job.nodes["d"].output().splitlines() if ln.startswith("Error:")]
    assert "timed out after 2 s" in d_line, d_line
    assert not job.records("c") and not job.records("d")  # they never joined
    job.wait_running(["a", "b"], 2, timeout_s=120)
    checked = _events(job, "a", "node.checked")
    assert checked and checked[0]["message"].startswith("node check passed in")
    job.go()
    for name in "ab":
        assert job.wait_exit(name) == 0, job.report()
    assert "node excluded during the job" in job.nodes["a"].output(), job.report()
    job.assert_no_survivors()


def test_the_link_check_runs_when_a_round_of_several_nodes_forms(job: Job) -> None:
    """``--link-check warn`` on a fair loopback: every node times the links once the round
    forms, before its workers start, and names nobody.

    The loopback is fair but its CPUs are not: four other test workers share the two cores,
    and at the default factor (1.5) one helper starved through its re-check was once named
    (a check of 16.9 s). A factor of 10 keeps the claim (nobody named on a fair link) out of
    the host's load; tests/e2e/test_link_netns.py names a really slow link at the default."""
    extra = ("--link-check", "warn", "--straggler-factor", "10")
    for name in "abc":
        job.start(name, nnodes="3", host=name == "a", extra=extra)
    job.wait_running(["a", "b", "c"], 3)
    job.go()
    for name in "abc":
        assert job.wait_exit(name) == 0, job.report()
    for name in "abc":
        (checked,) = _events(job, name, "link.checked")
        assert checked["fields"]["nodes"] == 3 and checked["fields"]["slow"] == 0, checked
        assert not _events(job, name, "link.slow")
        kinds = job.nodes[name].kinds()
        assert kinds.index("link.checked") < kinds.index("workers.started"), kinds
    job.assert_no_survivors()


def test_the_link_check_times_a_spare_that_takes_a_places_and_not_a_shrink(job: Job) -> None:
    """The link check runs when a round holds a node whose links were never timed, on every
    member alike: the spare that takes the excluded node's place at the same size is timed with
    the others (no node checks alone and waits out the helper's timeout), and a round that only
    lost a node times nothing again."""
    env = {"MN_BAD_NODE": "c"}
    warn = ("--max-restarts", "3", "--link-check", "warn")
    for name in "abc":
        job.start(name, nnodes="2:3", conf=FAST_CONF, host=name == "a", env=env, extra=warn)
    wait_until(lambda: "is suspect (1 of 2" in job.nodes["c"].output(), 120, message=job.report)
    job.start("d", nnodes="2:3", conf=FAST_CONF, env=env, extra=warn)
    assert job.wait_exit("c", 120) == 6, job.report()
    job.wait_running(["a", "b", "d"], 3, timeout_s=120)
    # d's round of three was timed on each of its members: d's one check, the last of a's and
    # b's, all of three nodes; nobody's helper timed out.
    for name in "abd":
        checks = _events(job, name, "link.checked")
        assert checks and checks[-1]["fields"]["nodes"] == 3, job.report()
        assert "link check" not in "".join(
            ln for ln in job.nodes[name].output().splitlines(True) if "timed out" in ln
        ), job.report()
    assert len(_events(job, "d", "link.checked")) == 1
    before = {name: len(_events(job, name, "link.checked")) for name in "ab"}
    # d's agent is killed: a and b re-form a round of two, whose links were all timed.
    job.nodes["d"].proc.kill()
    job.wait_running(["a", "b"], 2, timeout_s=120)
    job.go()
    for name in "ab":
        assert job.wait_exit(name) == 0, job.report()
        assert len(_events(job, name, "link.checked")) == before[name], job.report()
    job.assert_no_survivors()


def test_an_excluded_store_host_keeps_serving_until_the_job_ends(job: Job) -> None:
    """The bad node hosts the c10d store: it is excluded (its workers stop, it leaves every
    round, the spare takes its place) but keeps the store up until the others finish, then
    exits 6."""
    env = {"MN_BAD_NODE": "a"}
    for name in "abc":
        job.start(
            name, nnodes="2:3", conf=FAST_CONF, host=name == "a", env=env,
            extra=("--max-restarts", "3"),
        )  # fmt: skip
    wait_until(lambda: "is suspect (1 of 2" in job.nodes["a"].output(), 120, message=job.report)
    job.start("d", nnodes="2:3", conf=FAST_CONF, env=env, extra=("--max-restarts", "3"))
    wait_until(lambda: _events(job, "a", "node.serving"), 120, message=job.report)
    job.wait_running(["b", "c", "d"], 3, timeout_s=120)
    assert job.nodes["a"].proc.poll() is None  # still serving the store
    job.go()
    for name in "bcd":
        assert job.wait_exit(name) == 0, job.report()
    assert job.wait_exit("a", 60) == 6, job.report()
    job.assert_no_survivors()


def test_a_spare_whose_store_host_dies_says_so_once(job: Job) -> None:
    """Four nodes, ``--nnodes 2:3``, the fourth waits as a spare; then the store's host (a
    member) is SIGKILLed with its whole process group. The spare exits 4 and says the store is
    gone once: its one ``Error:`` line, after at most one warning (the first failed call, which
    it retries within its heartbeat budget), not a warning from every part on every turn."""
    spare, _, _ = _start_four_with_a_spare(job)
    seen: dict[str, Any] = {}

    def spare_shown() -> bool:
        seen.update(_status(job))
        return [w.get("health") for w in seen.get("waiting", [])] == ["spare"]

    wait_until(spare_shown, 120, message=lambda: json.dumps(seen)[-2000:])
    (waiting,) = seen["waiting"]
    names = {
        e["fields"]["node"]: name for name in "abcd" for e in _events(job, name, "agent.started")
    }
    assert names[waiting["node_id"]] == spare, job.report()
    assert spare != "a", job.report()  # the store's host is a member
    before = len(job.nodes[spare].output().splitlines())
    os.killpg(job.nodes["a"].proc.pid, signal.SIGKILL)
    assert job.wait_exit(spare, 120) == 4, job.report()
    lines = job.nodes[spare].output().splitlines()[before:]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and "cannot be reached" in errors[0], lines
    warnings = [ln for ln in lines if "WARNING" in ln]
    assert len(warnings) <= 1, "\n".join(warnings)
