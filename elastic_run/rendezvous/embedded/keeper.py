"""The keeper: the process that runs one embedded etcd member and cleans up after it.

The agent starts ``python -I -S keeper.py ROOT -- ETCD_ARGV...`` in a session of its own,
with a pipe on its stdin that only the agent holds. The keeper starts etcd as its child, with the
parent-death signal set (etcd dies if the keeper dies), and waits for EOF on the pipe: the agent
closed it, exited or was SIGKILLed, whichever. Then it stops etcd (SIGKILL; SIGTERM, a graceful
stop with a leader transfer, when the agent wrote ``term`` first), removes ROOT and exits 0.
Should etcd exit by itself, the keeper writes its status to ``ROOT/etcd.exited`` (what the agent
reads to tell a member that died from one that runs) and goes on waiting for EOF.

It also inherits, open, the descriptor that holds ROOT's lock (``elastic_run.rendezvous.owned_dir``; it
never reads it): while the keeper lives the folder is its owner's, and should the keeper be
SIGKILLed with the agent, the lock dies with them and the next elastic-run on the host removes
ROOT.

Invariants: it imports only the standard library (it runs with ``-I -S``), never elastic_run;
it ignores SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2, so a signal meant for the
agent's group or a whole Slurm step does not take it down before it has cleaned up; nothing it
started outlives it, and ROOT is gone when it exits.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading

__all__ = ["EXITED_FILE", "main"]

EXITED_FILE = "etcd.exited"

_PR_SET_PDEATHSIG = 1
_TERM_WAIT_S = 5.0


_IGNORED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def _die_with_keeper() -> None:
    """In etcd, between fork and exec: SIGKILL it when the keeper exits; default signals."""
    for sig in _IGNORED:  # an ignored signal stays ignored across exec
        signal.signal(sig, signal.SIG_DFL)
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _stop(proc: subprocess.Popen[bytes], graceful: bool) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
    try:
        proc.wait(timeout=_TERM_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _say_exit(proc: subprocess.Popen[bytes], root: str, stopping: threading.Event) -> None:
    code = proc.wait()
    if not stopping.is_set():
        sys.stdout.write(f"elastic-run keeper: etcd exited with status {code}\n")
        sys.stdout.flush()
        with open(os.path.join(root, EXITED_FILE), "w") as f:
            f.write(f"{code}\n")


def main(argv: list[str]) -> int:
    """Run etcd until the agent's pipe closes; then stop it and remove its data directory."""
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: keeper.py ROOT -- ETCD_ARGV...\n")
        return 2
    root, command = argv[1], argv[3:]
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    proc: subprocess.Popen[bytes] | None = None
    graceful = False
    stopping = threading.Event()
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_keeper,
        )
        threading.Thread(target=_say_exit, args=(proc, root, stopping), daemon=True).start()
        for line in sys.stdin.buffer:
            graceful = graceful or line.strip() == b"term"
    except OSError as exc:
        sys.stderr.write(f"keeper: cannot run {command[0]}: {exc}\n")
    finally:
        stopping.set()
        if proc is not None:
            _stop(proc, graceful)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
