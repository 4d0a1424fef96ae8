"""torch.distributed.elastic.multiprocessing.errors: how a worker's failure reaches the agent.

Owns nothing: the names are ``elastic_run.worker.error_handler``'s (the worker side) and
``ProcessFailure``, the agent's (``elastic_run.agent.workers.failures``). The modules, as torch's:
``error_handler`` (``ErrorHandler``, which writes the error file) and ``handlers``
(``get_error_handler``)."""

from __future__ import annotations

from elastic_run.agent.workers.failures import ProcessFailure
from elastic_run.worker.error_handler import (
    ChildFailedError,
    ErrorHandler,
    get_error_handler,
    record,
)

__all__ = [
    "ChildFailedError",
    "ErrorHandler",
    "ProcessFailure",
    "get_error_handler",
    "record",
]
