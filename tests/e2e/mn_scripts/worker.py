"""A tiny worker for the multi-node tests: record the env, maybe fail, wait for a "go" file.

Writes ``$MN_OUT/<MN_NODE>_<pid>.json`` with its launcher environment at once. Then:
``MN_FAIL_NODE`` names a node whose local rank 0 exits 1 while TORCHELASTIC_RESTART_COUNT is 0;
``MN_BAD_NODE`` names a node whose workers crash (SIGSEGV) at every start (a bad host);
``MN_FAIL_RANK`` names a global rank that exits 1 at every start, wherever it runs (a bug of the
script's that follows the rank);
every other worker waits until ``$MN_OUT/go`` exists (at most ``MN_MAX_WAIT_S``, default 120 s,
then exits 2; the first worker of node N to see a file ``$MN_OUT/fail-N`` meanwhile removes it
and exits 1, as a worker whose collective failed on a lost peer) and exits 0 (1 on the node ``MN_FAIL_AT_GO_NODE`` names, while
TORCHELASTIC_RESTART_COUNT is 0); the workers of the node ``MN_DONE_NODE`` names exit 0 at once.
``MN_HANG_NODE`` names a node whose local rank 0 beats progress ten times, 50 ms apart, then hangs
(no more beats, never exits) while TORCHELASTIC_RESTART_COUNT is 0: its agent's hang verdict
(``--hang-timeout``) kills it; no other worker beats, so no other is judged.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

NAMES = (
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
)

out = Path(os.environ["MN_OUT"])
node = os.environ.get("MN_NODE", "node")
record = {name: os.environ.get(name) for name in NAMES}
record.update(node=node, pid=os.getpid(), ppid=os.getppid())
tmp = out / f".{node}_{os.getpid()}.tmp"
tmp.write_text(json.dumps(record))
tmp.rename(out / f"{node}_{os.getpid()}.json")  # readers never see half a file

if (
    os.environ.get("MN_HANG_NODE") == node
    and os.environ["LOCAL_RANK"] == "0"
    and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
):
    import threading

    from elastic_run.worker import progress

    for step in range(10):
        progress(step)
        time.sleep(0.05)
    threading.Event().wait()  # hung: silent from here on
if os.environ.get("MN_BAD_NODE") == node:
    os.kill(os.getpid(), signal.SIGSEGV)
if os.environ.get("MN_FAIL_RANK") == os.environ["RANK"]:
    sys.exit(1)
if (
    os.environ.get("MN_FAIL_NODE") == node
    and os.environ["LOCAL_RANK"] == "0"
    and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
):
    sys.exit(1)

deadline = time.monotonic() + float(os.environ.get("MN_MAX_WAIT_S", "120"))
go = out / "go"
fail = out / f"fail-{node}"
while os.environ.get("MN_DONE_NODE") != node and not go.exists():
    if time.monotonic() > deadline:
        sys.exit(2)
    try:
        fail.unlink()
    except FileNotFoundError:
        pass
    else:
        sys.exit(1)
    time.sleep(0.05)
if os.environ.get("MN_FAIL_AT_GO_NODE") == node and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(1)
