"""A --logs-specs plugin: torch's DefaultLogsSpecs under $MY_LOGS_ROOT, whatever --log-dir says."""

import os

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs


class MyLogsSpecs(DefaultLogsSpecs):
    def __init__(self, log_dir=None, redirects=None, tee=None, local_ranks_filter=None):
        kwargs = {"local_ranks_filter": local_ranks_filter}
        if redirects is not None:
            kwargs["redirects"] = redirects
        if tee is not None:
            kwargs["tee"] = tee
        super().__init__(log_dir=os.environ["MY_LOGS_ROOT"], **kwargs)
