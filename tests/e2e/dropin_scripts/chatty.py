"""Print JSON lines on stdout and plain lines on stderr (rank in each), then exit 0."""

import json
import os
import sys

rank = int(os.environ["RANK"])
for i in range(3):
    print(json.dumps({"rank": rank, "i": i, "fruit": ["apple", "pear", "plum"][i]}))
    print(f"err {rank} {i} {['apple', 'pear', 'plum'][i]}", file=sys.stderr)
