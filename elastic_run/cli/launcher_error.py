"""The launcher's own error file: the root cause's record, where a scheduler asked for it.

When ``TORCHELASTIC_ERROR_FILE`` is set in the launcher's (the agent's) environment, as TorchX
or a batch system sets it, torchrun's ``@record`` main copies the root-cause worker's error
file there when the job fails, with the worker's exit code added as ``message.errorCode``
(torch's ``ErrorHandler.dump_error_file``). We do the same: the same record, the same format.
The root cause is the earliest failure (ties: the lowest rank). As in torchrun, nothing is
written when the root cause left no error file (it was not decorated with ``@record``, or a
signal killed it first); the workers' own files stay where they are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from elastic_run.agent.workers.failures import NOT_AVAILABLE, FailureRecord, root_cause

__all__ = ["write_launcher_error_file"]

log = logging.getLogger(__name__)


def write_launcher_error_file(path: str, failures: Iterable[FailureRecord]) -> bool:
    """Copy the root cause's error record to ``path`` (the launcher's TORCHELASTIC_ERROR_FILE).

    Args:
        path: the file to write.
        failures: this node's failed workers.

    Returns:
        Whether a record was written. A file that cannot be read or written is a warning: the
        job's exit code and summary stand.
    """
    from elastic_run.worker.error_handler import ErrorHandler

    first = root_cause(list(failures))
    if first is None or first.error_file == NOT_AVAILABLE or not os.path.isfile(first.error_file):
        return False

    class _Handler(ErrorHandler):
        def _get_error_file_path(self) -> str | None:
            return path

    try:
        _Handler().dump_error_file(first.error_file, first.exitcode)
    except (OSError, ValueError) as exc:
        log.warning("cannot write the launcher's error file %s: %s", path, exc)
        return False
    return True
