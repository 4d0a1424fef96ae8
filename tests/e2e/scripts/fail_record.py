"""Raise under an error-recording decorator: ``ours`` (elastic_run.worker.record) or ``torch``.

Local rank 1 raises ValueError("boom from rank 1"); the others exit 0.
"""

import os
import sys

if sys.argv[1] == "torch":
    from torch.distributed.elastic.multiprocessing.errors import record
else:
    from elastic_run.worker import record


@record
def main() -> None:
    rank = int(os.environ["LOCAL_RANK"])
    if rank == 1:
        raise ValueError(f"boom from rank {rank}")


if __name__ == "__main__":
    main()
