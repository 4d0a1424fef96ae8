"""torch.distributed.elastic.multiprocessing.errors: how a worker's failure reaches the agent.

Owns nothing: the names are ``elastic_run.multiprocessing_errors``'s. The modules, as torch's:
``error_handler`` (``ErrorHandler``, which writes the error file) and ``handlers``
(``get_error_handler``)."""

from __future__ import annotations

from elastic_run.multiprocessing_errors import (
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
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
