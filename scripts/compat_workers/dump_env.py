"""A worker for scripts/compat_torchrun.py: dump the environment, print a line to each stream.

Writes ``$COMPAT_OUT/env-<RANK>-<TORCHELASTIC_RESTART_COUNT>-<pid>.json``. With
``COMPAT_FAIL=1`` the worker of RANK 1 raises (under torch's ``@record``, so an error file is
written where the launcher asked for one). With ``COMPAT_WAIT=1`` it then waits (at most a
minute) for the launcher to stop it.
"""

import json
import os
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    rank = os.environ.get("RANK", "?")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    out = Path(os.environ["COMPAT_OUT"])
    (out / f"env-{rank}-{restart}-{os.getpid()}.json").write_text(json.dumps(dict(os.environ)))
    # One write a line: print() writes the text and the newline apart when Python runs unbuffered
    # (PYTHONUNBUFFERED), and two workers sharing torchrun's stdout then interleave mid-line.
    for stream, word in ((sys.stdout, "out"), (sys.stderr, "err")):
        stream.write(f"{word} from rank {rank}\n")
        stream.flush()
    if os.environ.get("COMPAT_FAIL") == "1" and rank == "1":
        raise RuntimeError("compat worker fails on purpose")
    if os.environ.get("COMPAT_WAIT") == "1":
        time.sleep(60)


if __name__ == "__main__":
    main()
