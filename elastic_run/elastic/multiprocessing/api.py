"""torch.distributed.elastic.multiprocessing.api: where the workers' output goes."""

from __future__ import annotations

from elastic_run.agent.workers.logs_specs import (
    DefaultLogsSpecs,
    LogsDest,
    LogsSpecs,
    Std,
)

__all__ = [
    "DefaultLogsSpecs",
    "LogsDest",
    "LogsSpecs",
    "Std",
]
