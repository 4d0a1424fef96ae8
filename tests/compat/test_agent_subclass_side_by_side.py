"""One torch-style subclass of ``SimpleElasticAgent``, run on torch's base and on ours.

torch's agent docs recommend extending ``SimpleElasticAgent`` and implementing
``_start_workers``, ``_stop_workers``, ``_monitor_workers`` and ``_shutdown``. The same subclass
body is put on torch's base and on ours; each runs a real one-node job (real worker processes,
a real c10d store) and records every hook call (with ``_shutdown``'s arguments), the group's
state and its workers' ids at each call, and every metric ``put_metric`` published. The two
records must be the same: the same calls in the same order, the same states, the same ids, the
same metrics. What stays different (an UNKNOWN monitor state: torch raises from ``run``, ours
returns exit 1 with the reason) is asserted as such, and listed in docs/python-api.md.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)

SUCCEED = "import sys; sys.exit(0)"
FAIL_FIRST = "import os, sys; sys.exit(3 if os.environ['ATTEMPT'] == '1' else 0)"
FAIL = "import sys; sys.exit(3)"


class _Metrics:
    """A metric handler that keeps every value (torch's and ours take the same handler)."""

    def __init__(self) -> None:
        self.values: list[tuple[str, int]] = []

    def emit(self, metric_data: Any) -> None:
        self.values.append((metric_data.name, metric_data.value))


def _agent_class(kind: str) -> type:
    api = importlib.import_module(
        {
            "torch": "torch.distributed.elastic.agent.server.api",
            "ours": "elastic_run.elastic.agent.server.api",
        }[kind]
    )
    errors = importlib.import_module(
        {
            "torch": "torch.distributed.elastic.multiprocessing.errors",
            "ours": "elastic_run.elastic.multiprocessing.errors",
        }[kind]
    )

    class PopenAgent(api.SimpleElasticAgent):  # type: ignore[misc, name-defined]
        def __init__(self, spec: Any, code: str, out: Path) -> None:
            super().__init__(spec, exit_barrier_timeout=10)
            self.code, self.out = code, out
            self.procs: dict[int, subprocess.Popen[bytes]] = {}
            self.calls: list[str] = []
            self.starts = 0

        def _seen(self, name: str) -> None:
            group = self._worker_group
            ids = [w.id is not None for w in group.workers]
            entry = f"{name} state={group.state.name} ids={ids}"
            if not self.calls or self.calls[-1] != entry:  # consecutive monitors: one entry
                self.calls.append(entry)

        def _start_workers(self, worker_group: Any) -> dict[int, Any]:
            self._seen("start")
            self.starts += 1
            for worker in worker_group.workers:
                env = dict(os.environ, ATTEMPT=str(self.starts), RANK=str(worker.global_rank))
                self.procs[worker.local_rank] = subprocess.Popen(
                    [sys.executable, "-c", self.code], env=env
                )
            return {lr: p.pid for lr, p in self.procs.items()}

        def _stop_workers(self, worker_group: Any) -> None:
            self._seen("stop")
            self._shutdown()

        def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
            self._seen(f"shutdown({death_sig.name}, {timeout})")
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.send_signal(death_sig)
            for proc in self.procs.values():
                proc.wait()

        def _monitor_workers(self, worker_group: Any) -> Any:
            self._seen("monitor")
            codes = {lr: p.wait() for lr, p in self.procs.items()}  # each run ends by itself
            failed = {lr: c for lr, c in codes.items() if c != 0}
            if failed:
                failures = {
                    worker_group.workers[lr].global_rank: errors.ProcessFailure(
                        lr, self.procs[lr].pid, c, "<N/A>"
                    )
                    for lr, c in failed.items()
                }
                return api.RunResult(api.WorkerState.FAILED, failures=failures)
            values = {w.global_rank: None for w in worker_group.workers}
            return api.RunResult(api.WorkerState.SUCCEEDED, return_values=values)

        def _restart_workers(self, worker_group: Any) -> None:
            self._seen("restart")
            super()._restart_workers(worker_group)

        def _initialize_workers(self, worker_group: Any) -> None:
            self._seen("initialize")
            super()._initialize_workers(worker_group)

    return PopenAgent


def _run(
    kind: str, code: str, max_restarts: int, tmp_path: Path
) -> tuple[Any, Any, list[tuple[str, int]]]:
    base = {"torch": "torch.distributed.elastic", "ours": "elastic_run.elastic"}[kind]
    api = importlib.import_module(f"{base}.agent.server.api")
    rdzv = importlib.import_module(f"{base}.rendezvous")
    registry = importlib.import_module(f"{base}.rendezvous.registry")
    metrics = importlib.import_module(f"{base}.metrics")
    params = rdzv.RendezvousParameters(
        "c10d", "127.0.0.1:0", f"sbs-{kind}-{uuid.uuid4().hex[:8]}", 1, 1
    )
    spec = api.WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=registry.get_rendezvous_handler(params),
        entrypoint=sys.executable,
        max_restarts=max_restarts,
        monitor_interval=0.05,
    )
    recorder = _Metrics()
    metrics.configure(recorder)
    try:
        agent = _agent_class(kind)(spec, code, tmp_path)
        result = agent.run()
    finally:
        metrics.configure(metrics.NullMetricHandler())
    return agent, result, recorder.values


@pytest.mark.parametrize(
    ("code", "max_restarts"),
    [(SUCCEED, 0), (FAIL_FIRST, 1), (FAIL, 0), (FAIL, 1)],
    ids=["succeeds", "fails-once", "fails-no-restart", "fails-after-a-restart"],
)
def test_the_same_subclass_behaves_the_same_on_both_bases(
    code: str, max_restarts: int, tmp_path: Path
) -> None:
    theirs, their_result, their_metrics = _run("torch", code, max_restarts, tmp_path)
    ours, our_result, our_metrics = _run("ours", code, max_restarts, tmp_path)
    assert ours.calls == theirs.calls
    assert our_result.state == their_result.state
    assert sorted(our_result.failures) == sorted(their_result.failures)
    assert {r: f.exitcode for r, f in our_result.failures.items()} == {
        r: f.exitcode for r, f in their_result.failures.items()
    }
    assert our_result.return_values == their_result.return_values
    assert ours.get_worker_group().state == theirs.get_worker_group().state
    assert ours._remaining_restarts == theirs._remaining_restarts
    assert _without_durations(our_metrics) == _without_durations(their_metrics)
    for event in ("get_event_succeeded", "get_event_failed"):
        mine, torchs = getattr(ours, event)(), getattr(theirs, event)()
        assert mine.name == torchs.name and mine.source.value == torchs.source.value
        assert set(mine.metadata) == set(torchs.metadata)
        for key in ("run_id", "role", "state", "group_rank", "agent_restarts"):
            if key != "run_id":
                assert mine.metadata[key] == torchs.metadata[key], key


def _without_durations(values: list[tuple[str, int]]) -> list[tuple[str, int | None]]:
    """The metrics, each duration's value left out (its name kept: it was published)."""
    return [(name, None if name.endswith(".duration.ms") else v) for name, v in values]


UNKNOWN = "import time; time.sleep(0.2)"


def test_an_unknown_monitor_state_ends_the_run_on_both_bases(tmp_path: Path) -> None:
    """torch's loop raises on a state it cannot handle; ours ends the run with exit 1 and the
    same sentence (its ``run`` never raises for the agent's own errors: the CLI exits with a
    code). Both shut the workers down."""
    results = {}
    for kind in ("torch", "ours"):
        api = importlib.import_module(
            {
                "torch": "torch.distributed.elastic.agent.server.api",
                "ours": "elastic_run.elastic.agent.server.api",
            }[kind]
        )
        cls = _agent_class(kind)

        class Lost(cls):  # type: ignore[misc, valid-type]
            unknown = api.RunResult(api.WorkerState.UNKNOWN)

            def _monitor_workers(self, worker_group: Any) -> Any:
                super()._monitor_workers(worker_group)
                return self.unknown

        base = {"torch": "torch.distributed.elastic", "ours": "elastic_run.elastic"}[kind]
        rdzv = importlib.import_module(f"{base}.rendezvous")
        registry = importlib.import_module(f"{base}.rendezvous.registry")
        params = rdzv.RendezvousParameters(
            "c10d", "127.0.0.1:0", f"unknown-{uuid.uuid4().hex[:8]}", 1, 1
        )
        spec = api.WorkerSpec(
            role="trainer",
            local_world_size=1,
            rdzv_handler=registry.get_rendezvous_handler(params),
            entrypoint=sys.executable,
            monitor_interval=0.05,
        )
        agent = Lost(spec, UNKNOWN, tmp_path)
        try:
            results[kind] = ("value", agent.run())
        except Exception as exc:
            results[kind] = ("raised", exc)
        assert any(c.startswith("shutdown(SIGTERM") for c in agent.calls), agent.calls
    kind, raised = results["torch"]
    assert kind == "raised" and "Worker group in UNKNOWN state" in str(raised)
    kind, result = results["ours"]
    assert kind == "value" and result.exit_code == 1 and result.is_failed()
    assert "Worker group in UNKNOWN state" in result.reason
