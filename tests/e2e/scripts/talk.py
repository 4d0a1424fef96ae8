"""Print one line on stdout and one on stderr, naming the local rank."""

import os
import sys

rank = os.environ["LOCAL_RANK"]
# One write per line: under -u, print writes the text and the newline apart, and another
# worker's line can land between them on a shared console.
sys.stdout.write(f"out-line from local rank {rank}\n")
sys.stdout.flush()
sys.stderr.write(f"err-line from local rank {rank}\n")
sys.stderr.flush()
