"""On the first attempt hang inside a 1 s watchdog timer; on later ones print and exit 0.

``ours``: elastic_run.worker.expires. ``torch``: torch's FileTimerClient and expires.
"""

import os
import sys
import time

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if restart >= 1:
    print(f"recovered on restart {restart}", flush=True)
    sys.exit(0)

if sys.argv[1] == "torch":
    import signal

    from torch.distributed.elastic import timer

    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal.SIGKILL))
    context = timer.expires(after=1, scope="hang")
else:
    from elastic_run.worker import expires

    context = expires(after=1, scope="hang")

with context:
    print("hanging inside the timer", flush=True)
    while True:
        time.sleep(0.1)
