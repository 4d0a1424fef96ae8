"""Write this worker's launcher environment as JSON to $OUT_DIR/env_<restart>_<local rank>.json.

With FAIL_ATTEMPTS=N, local rank 0 exits 1 on attempts 0..N-1 (after writing its file).
"""

import json
import os
import sys
from pathlib import Path

NAMES = (
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)

restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
local_rank = os.environ["LOCAL_RANK"]
out = Path(os.environ["OUT_DIR"]) / f"env_{restart}_{local_rank}.json"
out.write_text(json.dumps({name: os.environ.get(name) for name in NAMES}))
if local_rank == "0" and int(restart) < int(os.environ.get("FAIL_ATTEMPTS", "0")):
    sys.exit(1)
