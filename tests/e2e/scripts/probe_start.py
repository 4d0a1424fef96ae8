"""Write how this worker was started to $OUT_DIR/probe_<restart>_<local rank>.json.

Everything a cold and a warm start must agree on (environment, argv, sys.path[0], cwd, session,
signal dispositions and mask, parent-death signal, stdio, the ``__main__`` module and how the
script's code was compiled), and what must differ per worker (random seeds). Runs as a script
or as a module (``-m probe_start``). With HANG_ATTEMPTS=N it then waits for SIGKILL on attempts 0..N-1.
"""

import ctypes
import json
import os
import random
import signal
import sys
import threading
from pathlib import Path

import psutil

libc = ctypes.CDLL(None, use_errno=True)
pdeathsig = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(pdeathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
me = psutil.Process()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
local_rank = os.environ["LOCAL_RANK"]
dispositions = {}
for sig in signal.valid_signals():
    try:
        handler = signal.getsignal(sig)
    except (ValueError, OSError):
        continue
    if handler is not None:
        dispositions[str(int(sig))] = getattr(handler, "__name__", str(handler))
numpy_random = None
if "numpy" in sys.modules:
    import numpy

    numpy_random = float(numpy.random.random())


def annotated(x: int) -> None:  # evaluated annotations: no __future__ flag leaked in
    pass


main = sys.modules["__main__"]
main_module = {
    "is_this_module": vars(main) is globals(),
    "dunders": [k for k in globals() if k.startswith("__")],  # in their order
    "loader": [type(__loader__).__name__, getattr(__loader__, "name", None)],
    "loader_path": getattr(__loader__, "path", None),
    "spec": None if __spec__ is None else [__spec__.name, __spec__.origin],
    "package": __package__,
    "cached": globals().get("__cached__"),
    "builtins": type(__builtins__).__name__,
    "annotations": annotated.__annotations__["x"] is int,
}
probe = {
    "env": dict(os.environ),
    "argv": sys.argv,
    "cmdline": me.cmdline(),  # what ps and psutil show
    "proc_environ_is_os_environ": me.environ() == dict(os.environ),
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "name": __name__,
    "file": __file__,
    "main": main_module,
    "own_session": os.getsid(0) == os.getpid(),
    "own_group": os.getpgid(0) == os.getpid(),
    "pdeathsig": pdeathsig.value,
    "dispositions": dispositions,
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "stdin": os.readlink("/proc/self/fd/0"),
    "stdout_line_buffering": sys.stdout.line_buffering,
    "stderr_line_buffering": sys.stderr.line_buffering,
    "stdout_write_through": sys.stdout.write_through,
    "threads": threading.active_count(),
    "warm": any(a.endswith(b"zygote_process.py") for a in parent),
    "parent": os.getppid(),
    "pid": os.getpid(),
    "random": random.random(),
    "numpy_random": numpy_random,
    "hash": hash("elastic-run"),
}
out = Path(os.environ["OUT_DIR"])
tmp = out / f".probe_{restart}_{local_rank}.json"
tmp.write_text(json.dumps(probe))
tmp.rename(out / f"probe_{restart}_{local_rank}.json")
sys.stdout.write(f"probed rank {os.environ['RANK']} warm={probe['warm']}\n")  # one write
sys.stdout.flush()
if int(restart) < int(os.environ.get("HANG_ATTEMPTS", "0")):
    threading.Event().wait()
