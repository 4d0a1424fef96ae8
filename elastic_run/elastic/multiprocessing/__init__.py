"""torch.distributed.elastic.multiprocessing, mirrored: the workers' output and failures.

Owns nothing: the names are elastic-run's (``agent.workers.logs_specs``,
``worker.error_handler``), resolved on first use. The modules: ``api``, ``errors``. torch's
process-launch layer (``start_processes``, ``PContext``, ...) is not kept (README)."""

from __future__ import annotations

from typing import Any

from elastic_run.elastic.lazy_names import resolve

_NAMES = {
    "DefaultLogsSpecs": "elastic_run.elastic.multiprocessing.api",
    "LogsDest": "elastic_run.elastic.multiprocessing.api",
    "LogsSpecs": "elastic_run.elastic.multiprocessing.api",
    "ProcessFailure": "elastic_run.elastic.multiprocessing.errors",
    "Std": "elastic_run.elastic.multiprocessing.api",
}

__all__ = [
    "DefaultLogsSpecs",
    "LogsDest",
    "LogsSpecs",
    "ProcessFailure",
    "Std",
]


def __getattr__(name: str) -> Any:
    return resolve(__name__, _NAMES, name)
