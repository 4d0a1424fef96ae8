"""Raise an uncaught exception from a nested call; its traceback is what a test compares.

Run as a script or as a module (``-m raise_at_end``, with this folder on PYTHONPATH).
"""

import sys


def fail(what: str) -> None:
    raise ValueError(f"the script failed: {what}")


sys.stdout.write("LAST LINE\n")
sys.stdout.flush()
fail(sys.argv[-1])
