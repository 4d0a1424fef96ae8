"""bench_hung_host.py: a worker that only waits for STOP_FILE (standard library only).

Usage: idle_until_stop.py STOP_FILE. It polls for the file every 0.1 s and exits 0 once it exists.
"""

import os
import sys
import time

stop_file = sys.argv[1]
while not os.path.exists(stop_file):
    time.sleep(0.1)
