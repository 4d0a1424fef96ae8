"""An agent written as a torch user writes one, run as its own process by the agent compat tests.

    python agent_roles.py OUT ENDPOINT NNODES NPROC START_METHOD TARGET [ARGS...]

Builds a c10d rendezvous handler from ``RendezvousParameters``, a ``WorkerSpec`` whose
entrypoint is ``tests.compat.agent_targets.TARGET`` (string arguments), and a
``LocalElasticAgent(spec, logs_specs, start_method)``; runs it and writes what ``run()``
returned to ``OUT/result-<pid>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from elastic_run.agent.api import WorkerSpec  # noqa: E402
from elastic_run.agent.local import LocalElasticAgent  # noqa: E402
from elastic_run.agent.workers.logs_specs import DefaultLogsSpecs  # noqa: E402
from elastic_run.rendezvous.api import RendezvousParameters  # noqa: E402
from elastic_run.rendezvous.registry import get_rendezvous_handler  # noqa: E402
from tests.compat import agent_targets  # noqa: E402


def main(argv: list[str]) -> int:
    out, endpoint, nnodes, nproc, method, target, *args = argv
    params = RendezvousParameters(
        backend="c10d",
        endpoint=endpoint,
        run_id="compat-job",
        min_nodes=int(nnodes),
        max_nodes=int(nnodes),
        join_timeout="120",
    )
    spec = WorkerSpec(
        role="trainer",
        local_world_size=int(nproc),
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=getattr(agent_targets, target),
        args=tuple(args),
        max_restarts=0,
    )
    agent = LocalElasticAgent(spec, DefaultLogsSpecs(log_dir=out), method)
    result = agent.run()
    record = {
        "state": result.state.value,
        "return_values": {str(k): v for k, v in result.return_values.items()},
        "failures": {str(k): [f.exitcode, f.local_rank] for k, f in result.failures.items()},
        "group_rank": agent.get_worker_group().group_rank,
    }
    path = Path(out) / f"result-{os.getpid()}.json"
    path.write_text(json.dumps(record))
    return result.exit_code  # ours: 128+N when stopped by signal N


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
