"""torch.distributed.elastic.agent.server, mirrored: the agent's shapes and base classes.

Owns nothing: the names are ``elastic_run.agent``'s, resolved on first use. The modules:
``api``, ``local_elastic_agent``, ``health_check_server``. May import elastic-run's public
agent modules only."""

from __future__ import annotations

from typing import Any

from elastic_run.elastic.lazy_names import resolve

_NAMES = {
    "TORCHELASTIC_ENABLE_FILE_TIMER": "elastic_run.elastic.agent.server.local_elastic_agent",
    "TORCHELASTIC_TIMER_FILE": "elastic_run.elastic.agent.server.local_elastic_agent",
    "ElasticAgent": "elastic_run.elastic.agent.server.api",
    "RunResult": "elastic_run.elastic.agent.server.api",
    "SimpleElasticAgent": "elastic_run.elastic.agent.server.api",
    "Worker": "elastic_run.elastic.agent.server.api",
    "WorkerGroup": "elastic_run.elastic.agent.server.api",
    "WorkerSpec": "elastic_run.elastic.agent.server.api",
    "WorkerState": "elastic_run.elastic.agent.server.api",
}

__all__ = [
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_TIMER_FILE",
    "ElasticAgent",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
]


def __getattr__(name: str) -> Any:
    return resolve(__name__, _NAMES, name)
