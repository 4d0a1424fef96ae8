"""A program written against torch.distributed.elastic's public API runs on elastic-run after
one textual rewrite, ``torch.distributed.elastic`` -> ``elastic_run.elastic``.

The same text runs first as written (under torch, the reference) and then rewritten (under
ours), each in its own process: a c10d backend on a real TCPStore, a DynamicRendezvousHandler
from it, a LocalElasticAgent with one node of two workers, once with a script entrypoint and
once with a function entrypoint. Both must report SUCCEEDED with the same ranks and returns
(a function worker's ``torch.distributed.is_torchelastic_launched()`` among them: True).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.timeout(300)

PROGRAM = """
import json
import os
import sys
import uuid

import torch.distributed
from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler


def square(base):
    # torch.distributed.is_torchelastic_launched(): what a worker asks of its launcher
    return [base * base + int(os.environ["RANK"]), torch.distributed.is_torchelastic_launched()]


def main():
    out_dir, kind = sys.argv[1], sys.argv[2]
    run_id = "mirror-" + uuid.uuid4().hex[:8]
    params = RendezvousParameters(
        "c10d", "127.0.0.1:0", run_id, 1, 1, is_host="true", read_timeout="60"
    )
    backend, store = create_backend(params)
    handler = DynamicRendezvousHandler.from_backend(run_id, store, backend, 1, 1)
    if kind == "script":
        code = (
            "import os, pathlib, sys; "
            "pathlib.Path(sys.argv[1], os.environ['RANK']).write_text("
            "os.environ['WORLD_SIZE'] + ' ' + os.environ['LOCAL_RANK'])"
        )
        entrypoint, args = sys.executable, ("-c", code, out_dir)
    else:
        entrypoint, args = square, (3,)
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=handler,
        entrypoint=entrypoint,
        args=args,
        max_restarts=0,
        monitor_interval=0.1,
    )
    agent = LocalElasticAgent(spec, logs_specs=DefaultLogsSpecs(log_dir=out_dir + "/logs"))
    result = agent.run()
    handler.shutdown()
    print(json.dumps({
        "state": result.state.name,
        "succeeded": result.state == WorkerState.SUCCEEDED,
        "returns": {str(k): v for k, v in sorted(result.return_values.items())},
    }))


if __name__ == "__main__":
    main()
"""


def _run(text: str, out_dir: Path, kind: str) -> dict[str, object]:
    out_dir.mkdir()
    script = out_dir.parent / f"{out_dir.name}_program.py"
    script.write_text(text)
    done = subprocess.run(
        [sys.executable, str(script), str(out_dir), kind],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if kind == "script":
        result["ranks"] = {p.name: p.read_text() for p in sorted(out_dir.glob("[0-9]"))}
    return result


@pytest.mark.parametrize("kind", ["script", "function"])
def test_a_torch_program_runs_on_elastic_run_after_one_rewrite(tmp_path: Path, kind: str) -> None:
    rewritten = PROGRAM.replace("torch.distributed.elastic", "elastic_run.elastic")
    assert "torch.distributed.elastic" not in rewritten
    theirs = _run(PROGRAM, tmp_path / "torch", kind)
    ours = _run(rewritten, tmp_path / "ours", kind)
    assert theirs["state"] == "SUCCEEDED" and theirs["succeeded"] is True
    assert ours == theirs
    if kind == "script":
        assert ours["ranks"] == {"0": "2 0", "1": "2 1"}
    else:
        assert ours["returns"] == {"0": [9, True], "1": [10, True]}
