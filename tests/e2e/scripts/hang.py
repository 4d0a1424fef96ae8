"""Write ``<pid>`` (and a forked child's pid, with ``--fork``) to $OUT_DIR, then sleep forever."""

import os
import sys
import time
from pathlib import Path

out = Path(os.environ["OUT_DIR"])
rank = os.environ["LOCAL_RANK"]
if "--fork" in sys.argv:
    child = os.fork()
    if child == 0:
        while True:
            time.sleep(1)
    (out / f".grandchild_{rank}.tmp").write_text(str(child))
    os.replace(out / f".grandchild_{rank}.tmp", out / f"grandchild_{rank}")
# A temporary name the readers' "worker_*" does not match.
(out / f".worker_{rank}.tmp").write_text(str(os.getpid()))
os.replace(out / f".worker_{rank}.tmp", out / f"worker_{rank}")
while True:
    time.sleep(1)
