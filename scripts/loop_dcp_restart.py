"""Run issue 28's job again and again: does a restarted DCP job end, or hang at its end?

Each run is the job as a user runs it, the defaults (warm starts on: the script imports torch)::

    elastic-run --standalone --nproc-per-node 2 --max-restarts 1 dcp_restart.py CKPT

with ``tests/e2e/teardown_scripts/dcp_restart.py`` (gloo DDP, a DCP save at step 5, rank 1
exits with ``os._exit(17)`` at step 7 of the first attempt, the restart loads the checkpoint and
finishes). A run passes when the launcher exits 0 and both ranks printed their result. Past
``--limit-s`` a run that gave no verdict (no ``agent.exited`` line: issue 28's symptom, the job
waiting silently after its last line) hangs: every process under the launcher, and the
launcher, are dumped with py-spy (``--native`` with ``--native``), then SIGKILLed. One that gave
its verdict but had not exited yet (a loaded machine) gets ``--limit-s`` more, and is then judged
as any other run, a ``slow exit`` noted.
``--hogs N`` keeps N busy-looping processes running for the loop's duration (load, as on a
shared machine); ``--budget-s`` starts no new run past that many seconds. The last line says
runs, passes, hangs and failures, then the command of one run.

    .venv/bin/python scripts/loop_dcp_restart.py --runs 20 --limit-s 90
    .venv/bin/python scripts/loop_dcp_restart.py --runs 50 --hogs 2 --budget-s 1500
    .venv/bin/python scripts/loop_dcp_restart.py --launcher torchrun --runs 10
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "tests" / "e2e" / "teardown_scripts" / "dcp_restart.py"
BIN = Path(sys.executable).parent


def _command(launcher: str, checkpoint: Path) -> list[str]:
    return [
        str(BIN / launcher),
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        str(SCRIPT),
        str(checkpoint),
    ]


def _dump_survivors(root: psutil.Process, native: bool) -> str:
    """py-spy dumps of ``root`` and every process left under it."""
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return "(the launcher is gone)"
    parts = []
    for proc in tree:
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        command = [str(BIN / "py-spy"), "dump", "--pid", str(proc.pid)]
        if native:
            command.append("--native")
        dump = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        parts.append(f"--- pid {proc.pid}: {cmdline}\n{dump.stdout}{dump.stderr}")
    return "\n".join(parts)


def _kill_tree(root: psutil.Process) -> None:
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def _wait(proc: subprocess.Popen[bytes], limit_s: float) -> int | None:
    """The exit status of ``proc``, or None while it still runs after ``limit_s``."""
    try:
        return proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        return None


def _run_once(launcher: str, limit_s: float, native: bool, keep: Path) -> tuple[str, str]:
    """One job: ``(verdict, detail)``, verdict ``pass``, ``hang`` or ``fail``."""
    work = Path(tempfile.mkdtemp(prefix="dcp-loop-"))
    log = work / "launcher.log"
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                _command(launcher, work / "ckpt"),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work,
                start_new_session=True,
            )
        note = ""
        try:
            code = _wait(proc, limit_s)
            if code is None and "agent.exited" in log.read_text(errors="replace"):
                note = f"slow exit: the verdict came, the launcher still ran at {limit_s:g} s"
                code = _wait(proc, limit_s)
        except BaseException:  # the loop itself was stopped: leave nothing behind
            _kill_tree(psutil.Process(proc.pid))
            raise
        if code is None:
            root = psutil.Process(proc.pid)
            dump = _dump_survivors(root, native)
            _kill_tree(root)
            proc.wait()
            text = log.read_text(errors="replace")
            saved = keep / f"hang-{int(time.time())}-{proc.pid}.txt"
            saved.write_text(f"{text}\n=== survivors ===\n{dump}\n")
            verdict = "fail" if note else "hang"
            return (
                verdict,
                f"{note or 'no verdict'} after {limit_s:g} s; output and dumps in {saved}",
            )
        text = log.read_text(errors="replace")
        results = sum(f"RESULT rank={rank} " in text for rank in (0, 1))
        if code == 0 and results == 2:
            return "pass", note
        saved = keep / f"fail-{int(time.time())}-{proc.pid}.txt"
        saved.write_text(text)
        return "fail", f"exit {code}, {results} result line(s); output in {saved}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--limit-s", type=float, default=90.0, help="a run's bound, seconds")
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--launcher", choices=["elastic-run", "torchrun"], default="elastic-run")
    parser.add_argument("--native", action="store_true", help="py-spy dump --native")
    args = parser.parse_args()
    keep = Path(tempfile.mkdtemp(prefix="dcp-loop-logs-"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    counts = {"pass": 0, "hang": 0, "fail": 0}
    slow = 0
    started = time.monotonic()
    runs = 0
    try:
        for index in range(args.runs):
            if args.budget_s is not None and time.monotonic() - started > args.budget_s:
                print(f"budget of {args.budget_s:g} s spent after {runs} runs", flush=True)
                break
            begun = time.monotonic()
            verdict, detail = _run_once(args.launcher, args.limit_s, args.native, keep)
            runs += 1
            counts[verdict] += 1
            slow += detail.startswith("slow exit")
            took = time.monotonic() - begun
            print(f"run {index + 1}: {verdict} ({took:.1f} s) {detail}".rstrip(), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    command = " ".join(_command(args.launcher, Path("CKPT")))
    print(
        f"runs {runs}, passes {counts['pass']}, hangs {counts['hang']}, "
        f"failures {counts['fail']}, slow exits {slow} ({args.hogs} CPU hogs, {args.limit_s:g} s limit each, "
        f"logs in {keep}); command: {command}"
    )
    return 0 if counts["pass"] == runs else 1


if __name__ == "__main__":
    sys.exit(main())
