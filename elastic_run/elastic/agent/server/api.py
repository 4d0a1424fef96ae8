"""torch.distributed.elastic.agent.server.api: the agent's shapes and its base classes."""

from __future__ import annotations

from elastic_run.agent.api import (
    ElasticAgent,
    RunResult,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from elastic_run.agent.loop.simple import SimpleElasticAgent

__all__ = [
    "ElasticAgent",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
]
