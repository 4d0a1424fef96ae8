"""The global of ``globals_end.py`` and its finalizer (kept out of the script, see there)."""

import os
import sys


def say_at_exit() -> None:
    """An atexit handler: says that the interpreter's shutdown began."""
    os.write(1, b"ATEXIT\n")


class Witness:
    """Says when it is freed, and whether the interpreter was finalizing then.

    ``block``: its finalizer then blocks forever (a read of a pipe nobody writes), as a native
    destructor that waits for a thread can (torch's gloo process group, issue 28).
    """

    def __init__(self, how: str) -> None:
        self.block = how == "block"
        self.pipe = os.pipe()

    def __del__(self, _write=os.write, _read=os.read, _finalizing=sys.is_finalizing) -> None:
        # What it uses is bound at definition: module globals may be cleared at finalization.
        _write(1, f"FREED finalizing={_finalizing()}\n".encode())
        if self.block:
            _read(self.pipe[0], 1)
