"""Print one line on stdout and one on stderr, naming the local rank."""

import os
import sys

rank = os.environ["LOCAL_RANK"]
print(f"out-line from local rank {rank}", flush=True)
print(f"err-line from local rank {rank}", file=sys.stderr, flush=True)
