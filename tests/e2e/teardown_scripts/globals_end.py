"""When are a script's globals freed? As under ``python -u script``: in the interpreter's
finalization, after the atexit handlers, never while it is fully alive.

    globals_end.py record   the global ``witness`` says when it is freed (finalizer.py)
    globals_end.py block    its finalizer then blocks forever

Prints ``LAST LINE rank=R`` as its last act. It defines no function or class, so its globals
are in no reference cycle: they are freed the moment the last reference to its module goes.
"""

import atexit
import os
import sys

from finalizer import Witness, say_at_exit

atexit.register(say_at_exit)
witness = Witness(sys.argv[1])
sys.stdout.write(f"LAST LINE rank={os.environ['RANK']}\n")
sys.stdout.flush()
