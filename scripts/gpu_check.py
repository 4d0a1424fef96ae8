"""Prove elastic-run on a real NVIDIA GPU: seven checks, each with its own time limit, one table.

    PYTHONPATH=gpu-site:. python3 scripts/gpu_check.py [--only 1,3] [--json PATH] [--keep]
    python3 scripts/gpu_check.py --rehearse-on-cpu [--wheels DIR]    # no GPU: a rehearsal

Needs no set-up of the project's: the machine's own python3 with its CUDA torch, nvidia-smi,
the GPU, and the checkout and a folder of wheels on PYTHONPATH (docs/gpu-check.md: one
``pip download`` where an index is reachable, one ``pip install --no-index --target`` on the
machine, for scripts/gpu_check_requirements.txt). No venv, no apt, no network. It drives
elastic-run only through its CLI (``python -m elastic_run``), with the default settings unless
a check is about a flag, and the worker scripts in scripts/gpu_workers/:

1. ``--nproc-per-node gpu`` starts one worker per visible GPU, and each worker's environment is
   torchrun's (``python -m torch.distributed.run``, same flags) but for the documented extras
   (``ELASTIC_RUN_*``) and what differs by nature (MASTER_PORT, TORCHELASTIC_RUN_ID,
   TORCHELASTIC_ERROR_FILE).
2. A short CUDA training (NCCL, world 1) warm (the default), with ``--no-warm-start``, with
   ``--preload`` of a module that imports torch, and with ``--preload`` of one that calls
   ``torch.cuda.is_available()`` at import: each trains; the worker sees CUDA uninitialised at
   its start; the zygote holds no /dev/nvidia* file and no GPU memory (read in the zygote's
   /proc and from nvidia-smi, not assumed).
3. A worker SIGKILLed mid-training (``--max-restarts 1``) restarts warm and trains again; the
   killed worker's GPU memory is released before the new worker's first allocation.
4. Two agents (c10d, ``--nnodes 1:2``), one rank each on the same GPU over gloo with CUDA
   tensors; one agent SIGKILLed: the other trains again at world 1 and the job completes.
5. A rank stuck in a CUDA kernel (``torch.cuda._sleep`` in a loop) after its progress beats,
   ``--hang-timeout 5``: a ``worker.hung`` event and a restart, no traceback (5a); stacks
   naming the Python frame (5b: SKIP where the sandbox forbids py-spy's ptrace).
6. The agent SIGKILLed: within 5 s no process of the job holds GPU memory.
7. ``--virtual-local-rank`` (LOCAL_RANK, CUDA_VISIBLE_DEVICES, the device each worker sees) and
   ``--numa-binding node`` (each worker's CPU affinity; SKIP without numactl).

Each check prints a one-line verdict when it ends; then the table (check, verdict, figure,
detail). Exit status: 1 when any check FAILs, 0 otherwise, 2 for bad usage. A check that runs
past its limit FAILs with what it was waiting for. Every process a check started is killed
when it ends, whatever happened: the agents' process groups, then every process whose
environment carries the check's token (the workers run in sessions of their own).

A row SKIPs, saying why, where the machine forbids what it needs (gVisor's /proc and ptrace
may): 2e when the zygote's /proc/PID/fd cannot be read, 5b when py-spy may not read the
worker. Before any check, the agents' imports are looked up (the facts line says where each
comes from); one missing is one ``Error:`` line and exit 2.

On a machine without a GPU (no nvidia-smi, nvidia-smi lists none, or torch sees no CUDA) it
prints one line saying so and exits 0. ``--rehearse-on-cpu`` (a development aid, not a GPU
check) stands a fresh venv holding torch alone in for the GPU machine's python3, installs the
wheels into a folder with ``pip install --no-index --target`` (downloading them first, unless
``--wheels`` gives them), and runs the same orchestration with that python and that folder on
PYTHONPATH, on CPU with gloo, ``--nproc-per-node 2`` for ``gpu``; readings that need a GPU are
left out.

The pure logic (parsing, comparing, the table) is scripts/gpu_check_logic.py, unit-tested in
tests/unit/test_gpu_check.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

import gpu_check_logic as logic  # noqa: E402 - found through the line above

WORKER = SCRIPTS / "gpu_workers" / "gpu_worker.py"
TIME_LIMITS_S = {1: 40.0, 2: 70.0, 3: 35.0, 4: 40.0, 5: 40.0, 6: 25.0, 7: 35.0}
"""Each check's own limit; together under 5 minutes, the GPU probe included."""
MEMORY_RELEASE_LIMIT_S = 5.0
T = TypeVar("T")

_TORCH_PROBE = (
    "import json, torch; print(json.dumps({'available': bool(torch.cuda.is_available()), "
    "'count': int(torch.cuda.device_count()), 'version': torch.__version__}))"
)


class CheckTimeout(Exception):
    """A check ran past its limit."""


@dataclass
class Deadline:
    """A check's time limit, and the one way its waits poll."""

    limit_s: float
    start: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return self.limit_s - (time.monotonic() - self.start)

    def wait_for(self, probe: Callable[[], T | None], what: str, interval_s: float = 0.05) -> T:
        """Poll ``probe`` until it returns something other than None or False.

        Raises:
            CheckTimeout: the limit passed first; the message says what was awaited.
        """
        while True:
            value = probe()
            if value is not None and value is not False:
                return value
            if self.left_s() <= 0:
                raise CheckTimeout(f"timed out after {self.limit_s:g} s waiting for {what}")
            time.sleep(interval_s)


@dataclass(frozen=True)
class Machine:
    """What the checks need to know of this machine."""

    device: str  # "cuda", or "cpu" in the rehearsal
    count: int  # CUDA devices torch sees (the workers of --nproc-per-node gpu)
    gpus: tuple[logic.Gpu, ...]
    torch_version: str
    nvidia_smi: str | None

    @property
    def nproc_gpu(self) -> str:
        return "gpu" if self.device == "cuda" else str(self.count)

    @property
    def collective_backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def smi(self, *args: str) -> str | None:
        if self.nvidia_smi is None:
            return None
        try:
            done = subprocess.run(
                [self.nvidia_smi, *args], capture_output=True, text=True, timeout=15
            )
        except subprocess.TimeoutExpired:
            return None
        return done.stdout if done.returncode == 0 else None

    def compute_apps(self) -> list[logic.ComputeApp] | None:
        """The processes holding GPU memory now (None: not readable here)."""
        text = self.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        return None if text is None else logic.parse_compute_apps(text)

    def memory_used_mib(self) -> int | None:
        text = self.smi(
            "--query-gpu=index,name,pci.bus_id,uuid,memory.used", "--format=csv,noheader,nounits"
        )
        if text is None:
            return None
        used = [g.memory_used_mib for g in logic.parse_gpus(text)]
        return None if None in used else sum(u for u in used if u is not None)


def detect(rehearse: bool) -> Machine | str:
    """This machine's GPUs as torch and nvidia-smi see them, or why there are none."""
    if rehearse:
        import torch

        return Machine("cpu", 2, (), torch.__version__, None)
    smi = shutil.which("nvidia-smi")
    rc, out = 0, ""
    if smi is not None:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=index,name,pci.bus_id,uuid,memory.used"]
                + ["--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            rc, out = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            return "nvidia-smi did not answer within 30 s"
    reason = logic.smi_absence(smi, rc, out)
    if reason is not None:
        return reason
    gpus = tuple(logic.parse_gpus(out))
    try:  # in a child, so that this process never touches the CUDA driver
        done = subprocess.run(
            [sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=120
        )
        probe = json.loads(done.stdout.strip().splitlines()[-1])
        error = ""
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        probe, error = {"available": False, "count": 0, "version": "?"}, repr(exc)
    reason = logic.torch_absence(probe["available"], probe["count"], probe["version"], error)
    if reason is not None:
        return reason
    return Machine("cuda", probe["count"], gpus, probe["version"], smi)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def marked_processes(token: str) -> dict[int, str]:
    """pid -> command line of every process whose environment carries ``GPUCHECK_TOKEN=token``
    (this one excepted)."""
    marker = f"GPUCHECK_TOKEN={token}".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdecimal() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and is_alive(int(entry.name)):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]
    return found


def kill_marked(token: str) -> list[int]:
    """SIGKILL every process whose environment carries ``GPUCHECK_TOKEN=token``."""
    killed: list[int] = []
    for _ in range(3):  # a parent may fork while the first pass runs
        found = marked_processes(token)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if not found:
            break
    return killed


class Job:
    """One launched command (an agent or torchrun), in a session of its own, output to a file."""

    def __init__(self, label: str, argv: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.label = label
        self.log = log
        self.started_at = time.time()
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                list(argv),
                env=env,
                cwd=log.parent,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, deadline: Deadline) -> int:
        """Its exit status (negative: killed by that signal).

        Raises:
            CheckTimeout: it ran past the check's limit.
        """
        return deadline.wait_for(self.proc.poll, f"{self.label} to exit", 0.1)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, lines: int = 6) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept)


class Run:
    """One check's processes, files and clean-up."""

    def __init__(self, machine: Machine, number: int, root: Path) -> None:
        self.machine = machine
        self.number = number
        self.dir = root / f"check{number}"
        self.dir.mkdir(parents=True)
        self.records_path = self.dir / "records.jsonl"
        self.token = uuid.uuid4().hex
        self.jobs: list[Job] = []

    @staticmethod
    def plain_env() -> dict[str, str]:
        """Every check's environment before its own variables: this one's, less Slurm's (an
        allocation's variables would make the standalone runs Slurm jobs, which also need
        python-hostlist, left out of the wheels: the checks are about the GPU), the checkout
        first on PYTHONPATH, and the programs of the PYTHONPATH folders (``pip install --target
        DIR`` puts py-spy in DIR/bin) first on PATH."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        paths = [str(REPO)] + [
            str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p
        ]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PATH"] = Run.env_path()
        return env

    @staticmethod
    def env_path() -> str:
        """PATH for the checks' processes (see :meth:`plain_env`)."""
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        programs = [str(Path(p).resolve() / "bin") for p in paths if (Path(p) / "bin").is_dir()]
        return os.pathsep.join([*programs, os.environ.get("PATH", os.defpath)])

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = self.plain_env()
        env.update(
            GPUCHECK_TOKEN=self.token,
            GPUCHECK_RECORDS=str(self.records_path),
            GPUCHECK_OUT=str(self.dir),
        )
        env.update(extra or {})
        return env

    def launch(
        self, label: str, argv: Sequence[str], extra_env: dict[str, str] | None = None
    ) -> Job:
        job = Job(label, argv, self.env(extra_env), self.dir / f"{label}.log")
        self.jobs.append(job)
        return job

    def elastic_run(
        self,
        label: str,
        flags: Sequence[str],
        worker_args: Sequence[str],
        extra_env: dict[str, str] | None = None,
    ) -> Job:
        argv = [sys.executable, "-m", "elastic_run", *flags, str(WORKER), *worker_args]
        return self.launch(label, argv, extra_env)

    def torchrun(self, label: str, flags: Sequence[str], worker_args: Sequence[str]) -> Job:
        argv = [sys.executable, "-m", "torch.distributed.run", *flags, str(WORKER), *worker_args]
        return self.launch(label, argv)

    def records(self) -> list[dict[str, Any]]:
        try:
            return logic.parse_records(self.records_path.read_text())
        except FileNotFoundError:
            return []

    def env_docs(self, label: str) -> dict[int, dict[str, Any]]:
        """RANK -> what the workers of ``gpu_worker.py env LABEL`` wrote."""
        docs = {}
        for path in self.dir.glob(f"env-{label}-*.json"):
            doc = json.loads(path.read_text())
            docs[int(doc["env"].get("RANK", "-1"))] = doc
        return docs

    def last_words(self) -> str:
        """The last lines of the job started last (what a timed-out check was waiting on)."""
        if not self.jobs:
            return ""
        job = self.jobs[-1]
        return f"{job.label}'s last lines: {job.tail(2)} (log: {job.log})"

    def close(self) -> list[int]:
        """Kill everything this check started; return the pids found still running."""
        for job in self.jobs:
            job.kill()
        return kill_marked(self.token)


def _row(n: int, verdict: str, figure: str, detail: str, part: str = "") -> logic.Result:
    name = logic.CHECKS[n]
    return logic.Result(f"{n}{part}", name, verdict, figure, detail)


def _judged(
    n: int,
    problems: list[str],
    figure: str,
    notes: list[str],
    part: str = "",
    skips: Sequence[str] = (),
) -> logic.Result:
    """FAIL on a problem; SKIP (saying why) where the machine forbade what the row needs."""
    verdict = logic.verdict_of(problems, skips)
    shown = [f"SKIP: {why}" for why in skips] if verdict == "SKIP" else []
    return _row(n, verdict, figure, "; ".join(problems + shown + notes), part)


def _train_args(machine: Machine, *extra: str) -> list[str]:
    return ["train", "--device", machine.device, *extra]


def _steps(records: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [
        r for r in records if r["kind"] == "step" and all(r.get(k) == v for k, v in match.items())
    ]


def _one(records: list[dict[str, Any]], kind: str, **match: Any) -> dict[str, Any] | None:
    for r in records:
        if r["kind"] == kind and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


# --- 1 ---------------------------------------------------------------------------------------


def check_env(run: Run, deadline: Deadline) -> list[logic.Result]:
    m = run.machine
    flags = ["--standalone", "--nproc-per-node", m.nproc_gpu]
    ours = run.elastic_run(
        "elastic-run", [*flags, "--log-dir", str(run.dir / "logs-ours")], ["env", "elastic-run"]
    )
    theirs = run.torchrun(
        "torchrun", [*flags, "--log-dir", str(run.dir / "logs-torchrun")], ["env", "torchrun"]
    )
    codes = {job.label: job.wait(deadline) for job in (ours, theirs)}
    problems = [
        f"{label} exited {code}: {job.tail()}"
        for (label, code), job in zip(codes.items(), (ours, theirs), strict=True)
        if code != 0
    ]
    docs = {label: run.env_docs(label) for label in codes}
    for label, found in docs.items():
        if sorted(found) != list(range(m.count)):
            problems.append(f"{label} started ranks {sorted(found)} for {m.count} visible GPUs")
    compared: set[str] = set()
    for rank in sorted(set(docs["elastic-run"]) & set(docs["torchrun"])):
        a, b = docs["elastic-run"][rank]["env"], docs["torchrun"][rank]["env"]
        compared |= set(a) | set(b)
        problems += [f"rank {rank}: {d}" for d in logic.env_differences(a, b)]
    workers = len(docs["elastic-run"])
    figure = f"{workers} workers for {m.count} GPUs, {len(compared)} variables compared"
    notes = [f"ignored by nature: {', '.join(sorted(logic.IGNORED_ENV_KEYS))}, ELASTIC_RUN_*"]
    return [_judged(1, problems, figure, [] if problems else notes)]


# --- 2 ---------------------------------------------------------------------------------------

_VARIANTS = (
    ("a", "warm (default)", (), True),
    ("b", "--no-warm-start", ("--no-warm-start",), False),
    ("c", "--preload (imports torch)", ("--preload", "gpucheck_preload"), True),
    ("d", "--preload (calls is_available)", ("--preload", "gpucheck_preload_probe"), None),
)


def check_training(run: Run, deadline: Deadline) -> list[logic.Result]:
    m = run.machine
    rows = []
    zygotes: list[tuple[str, dict[str, Any] | None]] = []
    for part, label, flags, warm in _VARIANTS:
        node = f"2{part}"
        job = run.elastic_run(
            node,
            ["--standalone", "--nproc-per-node", "1", *flags],
            _train_args(m, "--backend", m.collective_backend, "--steps", "20", "--gpu-pids-at-end"),
            {"GPUCHECK_NODE": node},
        )
        code = job.wait(deadline)
        records = [r for r in run.records() if r.get("node") == node]
        problems, notes = _training_problems(code, job, records, warm, m)
        steps = _steps(records)
        figure = (
            f"{label}: first step {steps[0]['t'] - job.started_at:.1f} s after launch"
            if steps
            else label
        )
        rows.append(_judged(2, problems, figure, notes, part))
        start = _one(records, "start")
        zygotes.append((node, start.get("zygote") if start is not None else None))
    return [*rows, _zygote_row(zygotes)]


def _zygote_row(zygotes: list[tuple[str, dict[str, Any] | None]]) -> logic.Result:
    """2e: no zygote of the four trainings opened the CUDA driver (its /dev/nvidia* files, read
    in its /proc); SKIP where /proc does not show another process's descriptors (a sandbox)."""
    problems, skips, notes = [], [], []
    for node, zygote in zygotes:
        if zygote is None:
            continue  # a cold start (2b) or no worker: judged in its own row
        if zygote.get("error"):
            skips.append(f"{node}: the zygote's /proc/PID/fd is not readable: {zygote['error']}")
        elif zygote["nvidia_fds"]:
            problems.append(f"{node}: the zygote opened the CUDA driver ({zygote['nvidia_fds']})")
        else:
            notes.append(
                f"{node}: no /dev/nvidia* open"
                + (", libcuda mapped" if zygote.get("libcuda") else "")
            )
    if not (problems or skips or notes):
        skips.append("no warm worker reported its zygote")
    return _judged(2, problems, f"{len(zygotes)} trainings", notes, "e", skips)


def _training_problems(
    code: int, job: Job, records: list[dict[str, Any]], warm: bool | None, m: Machine
) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    notes: list[str] = []
    if code != 0:
        problems.append(f"exit {code}: {job.tail()}")
    start, done, steps = _one(records, "start"), _one(records, "done"), _steps(records)
    if start is None:
        return problems + ["the worker never started"], notes
    if start["cuda_initialized"]:
        problems.append("CUDA was initialised before the worker touched it")
    if start.get("bad_fork"):
        problems.append(
            "forked from a process that initialised the CUDA driver: torch refuses CUDA "
            "in this worker (Cannot re-initialize CUDA in forked subprocess)"
        )
    forked = start["parent_is_zygote"]
    if forked is None:  # the parent's /proc/PID/cmdline is not readable here (a sandbox)
        notes.append("warm or cold not known: the parent's /proc/PID/cmdline is not readable")
    elif warm is True and not forked:
        problems.append("started cold, not forked by the zygote")
    elif warm is False and forked:
        problems.append("forked by the zygote under --no-warm-start")
    if forked is not None:
        notes.append("warm" if forked else "cold")
    # (the zygote's CUDA driver: row 2e, for the four trainings together)
    if len(steps) != 20 or done is None:
        problems.append(f"{len(steps)} of 20 steps, done: {done is not None}")
    elif not (done["finite"] and steps[-1]["loss"] < steps[0]["loss"]):
        problems.append(f"did not train: loss {steps[0]['loss']:.4g} -> {steps[-1]['loss']:.4g}")
    else:
        notes.append(
            f"loss {steps[0]['loss']:.3g} -> {steps[-1]['loss']:.3g} on {steps[0]['device']}"
        )
    if done is not None and m.device == "cuda":
        listed = done.get("gpu_pids")
        if isinstance(listed, str):
            notes.append(f"GPU pids unreadable: {listed}")
        elif isinstance(listed, list):
            pids = {int(p) for p, _ in listed}
            if done["pid"] not in pids:
                notes.append("nvidia-smi does not list this namespace's pids")
            elif start["parent_is_zygote"] and start["ppid"] in pids:
                problems.append(f"the zygote (pid {start['ppid']}) holds GPU memory")
    return problems, notes


# --- 3 ---------------------------------------------------------------------------------------


def check_worker_kill(run: Run, deadline: Deadline) -> list[logic.Result]:
    m = run.machine
    baseline = m.memory_used_mib()
    job = run.elastic_run(
        "agent",
        ["--standalone", "--nproc-per-node", "1", "--max-restarts", "1"],
        _train_args(m, "--steps", "40", "--step-sleep", "0.05", "--gpu-pids-at-start"),
    )
    first = deadline.wait_for(
        lambda: next((r for r in _steps(run.records(), restart=0) if r["step"] >= 5), None),
        "the first worker's 6th step",
    )
    victim = int(first["pid"])
    before = m.compute_apps()
    visible = before is not None and victim in {a.pid for a in before}
    during = m.memory_used_mib()
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    again = deadline.wait_for(
        lambda: logic.first_step_after(run.records(), killed_at, excluded_pids=[victim]),
        "a new worker's first step after the SIGKILL",
    )
    code = job.wait(deadline)
    records = run.records()
    problems: list[str] = []
    notes: list[str] = []
    if code != 0:
        problems.append(f"exit {code}: {job.tail()}")
    start = _one(records, "start", restart=1)
    if start is None:
        problems.append("no worker started after the kill")
    else:
        if start["parent_is_zygote"] is None:
            notes.append("warm or cold not known: the parent's /proc/PID/cmdline is not readable")
        elif not start["parent_is_zygote"]:
            problems.append("the new worker started cold")
        if m.device == "cuda":
            _judge_release(start, victim, visible, (baseline, during), problems, notes)
    if len(_steps(records, restart=1)) != 40 or _one(records, "done", restart=1) is None:
        problems.append("the restarted worker did not finish its 40 steps")
    figure = f"{again['t'] - killed_at:.2f} s kill -> training again"
    return [_judged(3, problems, figure, notes)]


def _judge_release(
    start: dict[str, Any],
    victim: int,
    visible: bool,
    memory: tuple[int | None, int | None],
    problems: list[str],
    notes: list[str],
) -> None:
    """Was the killed worker's GPU memory free when the new worker started (before its first
    allocation)? By pid where nvidia-smi lists this namespace's pids, else by memory.used."""
    listed = start.get("gpu_pids")
    if visible and isinstance(listed, list):
        if victim in {p for p, _ in listed}:
            problems.append(f"the killed worker {victim} still held GPU memory")
        else:
            notes.append(f"pid {victim} gone from the GPU before the new worker's first alloc")
        return
    baseline, during = memory
    now = start.get("memory_used_mib")
    if baseline is None or during is None or now is None:
        problems.append(f"cannot judge: pids not listed ({listed}) and memory.used unreadable")
    elif during < baseline + 200:
        problems.append(
            f"cannot judge: pids not listed, and memory.used rose only {baseline} -> {during} MiB"
        )
    elif now > baseline + 64:
        problems.append(
            f"memory.used {now} MiB at the new worker's start ({baseline} before the job, "
            f"{during} while the killed worker ran)"
        )
    else:
        notes.append(f"memory.used {during} -> {now} MiB (pids not listed; {baseline} before)")


# --- 4 ---------------------------------------------------------------------------------------


def check_two_agents(run: Run, deadline: Deadline) -> list[logic.Result]:
    m = run.machine
    port = free_port()
    common = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    common += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"gpucheck-{run.token[:8]}"]
    common += ["--local-addr", "127.0.0.1"]
    train = _train_args(m, "--backend", "gloo", "--steps", "60", "--step-sleep", "0.05")
    a = run.elastic_run(
        "A", [*common, "--rdzv-conf", "is_host=true"], train, {"GPUCHECK_NODE": "A"}
    )
    b = run.elastic_run(
        "B", [*common, "--rdzv-conf", "is_host=false"], train, {"GPUCHECK_NODE": "B"}
    )

    def both_train() -> bool:
        records = run.records()
        return all(
            any(r["step"] >= 5 for r in _steps(records, node=node, world=2)) for node in "AB"
        )

    deadline.wait_for(both_train, "both ranks to take 6 steps at world 2")
    b_workers = {int(r["pid"]) for r in run.records() if r.get("node") == "B"}
    killed_at = time.time()
    os.kill(b.pid, signal.SIGKILL)
    again = deadline.wait_for(
        lambda: logic.first_step_after(run.records(), killed_at, world=1),
        "node A's first step at world 1",
    )
    code = a.wait(deadline)
    records = run.records()
    problems: list[str] = []
    if code != 0:
        problems.append(f"agent A exited {code}: {a.tail()}")
    done = [r for r in records if r["kind"] == "done" and r["node"] == "A" and r["world"] == 1]
    if not done:
        problems.append("node A did not finish at world 1")
    device = {r["device"] for r in _steps(records)}
    survivors = sorted(p for p in b_workers if is_alive(p))
    if survivors:
        problems.append(f"node B's workers outlived its agent: {survivors}")
    notes = [f"tensors on {', '.join(sorted(device))}"]
    figure = f"{again['t'] - killed_at:.2f} s kill -> training again at world 1"
    return [_judged(4, problems, figure, notes)]


# --- 5 ---------------------------------------------------------------------------------------


def check_hang(run: Run, deadline: Deadline) -> list[logic.Result]:
    m = run.machine
    logs = run.dir / "logs"
    job = run.elastic_run(
        "agent",
        ["--standalone", "--nproc-per-node", "1", "--max-restarts", "1"]
        + ["--hang-timeout", "5", "--log-dir", str(logs)],
        _train_args(m, "--steps", "20", "--hang-at", "5"),
    )
    hang = deadline.wait_for(lambda: _one(run.records(), "hang"), "the worker to start hanging")
    again = deadline.wait_for(
        lambda: next(iter(_steps(run.records(), restart=1)), None), "a step after the restart"
    )
    code = job.wait(deadline)
    problems: list[str] = []
    notes: list[str] = []
    if code != 0:
        problems.append(f"exit {code}: {job.tail()}")
    events = []
    for path in logs.glob("*/events.jsonl"):
        events += logic.parse_records(path.read_text())
    hung = [e for e in events if e["kind"] == "worker.hung"]
    if not hung:
        problems.append("no worker.hung event in events.jsonl")
        silent = "?"
    else:
        fields = hung[0]["fields"]
        silent = f"{float(fields.get('silent_s', 0)):.1f}"
        notes.append(f"where: {fields.get('where')}")
        if fields.get("stacks_error"):
            notes.append(f"no stacks: {fields['stacks_error']}")
    if "Traceback" in job.log.read_text(errors="replace"):
        problems.append(f"a traceback in the agent's output (log: {job.log})")
    records = run.records()
    if len(_steps(records, restart=1)) != 20:
        problems.append("the restarted worker did not finish its 20 steps")
    figure = f"judged after {silent} s silent; training again {again['t'] - hang['t']:.1f} s after"
    return [_judged(5, problems, figure, notes, "a"), _stacks_row(logs)]


def _stacks_row(logs: Path) -> logic.Result:
    """5b: the hung worker's stacks name the Python frame stuck in the kernel; SKIP where the
    machine forbids reading another process's memory (py-spy's ptrace, in a sandbox)."""
    stacks = sorted(logs.glob("*/attempt_0/0/stacks.txt"))
    text = stacks[0].read_text(errors="replace") if stacks else ""
    refusal = logic.sandbox_refusal(text)
    if refusal is not None:
        return _judged(5, [], "", ["the hang verdict fired without them (5a)"], "b", [refusal])
    problems = []
    if "stuck_in_cuda_sleep" not in text:
        problems.append(
            "stacks.txt does not name stuck_in_cuda_sleep"
            + (f": {text[:300]!r}" if text else " (no stacks.txt)")
        )
    return _judged(5, problems, "stacks name stuck_in_cuda_sleep" if not problems else "", [], "b")


# --- 6 ---------------------------------------------------------------------------------------


def check_agent_kill(run: Run, deadline: Deadline) -> list[logic.Result]:
    m = run.machine
    baseline = m.memory_used_mib()
    job = run.elastic_run(
        "agent",
        ["--standalone", "--nproc-per-node", m.nproc_gpu],
        _train_args(m, "--steps", "100000", "--step-sleep", "0.05"),
    )

    def all_train() -> bool:
        records = run.records()
        return all(any(r["step"] >= 3 for r in _steps(records, rank=k)) for k in range(m.count))

    deadline.wait_for(all_train, "every worker's 4th step")
    starts = [r for r in run.records() if r["kind"] == "start"]
    job_pids = {int(r["pid"]) for r in starts}
    job_pids |= {int(r["ppid"]) for r in starts if r["parent_is_zygote"]}
    before = m.compute_apps()
    visible = before is not None and bool(job_pids & {a.pid for a in before})
    killed_at = time.monotonic()
    os.kill(job.pid, signal.SIGKILL)
    problems: list[str] = []
    notes: list[str] = []

    def gpu_free() -> bool:
        if visible:
            apps = m.compute_apps()
            return apps is not None and not (job_pids & {a.pid for a in apps})
        if m.device == "cuda" and baseline is not None:
            used = m.memory_used_mib()
            return used is not None and used <= baseline + 64
        return not any(is_alive(p) for p in job_pids)  # the rehearsal: processes only

    if m.device == "cuda" and not visible:
        notes.append("nvidia-smi lists no pid of this namespace: judged by memory.used")
    deadline.wait_for(gpu_free, "the GPU to be free of the job", 0.05)
    took = time.monotonic() - killed_at
    if took > MEMORY_RELEASE_LIMIT_S:
        problems.append(f"the job held GPU memory {took:.1f} s after the agent's SIGKILL")
    survivors = sorted(p for p in job_pids if is_alive(p))
    if survivors:
        problems.append(f"processes of the job still alive: {survivors}")
    notes.append(f"{len(job_pids)} job processes watched")
    # Whatever else the job started (the guardian, py-spy): gone within the same 5 s?
    window_s = MEMORY_RELEASE_LIMIT_S - (time.monotonic() - killed_at)
    if window_s > 0:
        _wait_quietly(lambda: not marked_processes(run.token), window_s)
    lingering = marked_processes(run.token)
    if lingering:
        notes.append(
            f"{MEMORY_RELEASE_LIMIT_S:g} s after the kill still running (no GPU memory): "
            + "; ".join(f"{pid} {cmd}" for pid, cmd in sorted(lingering.items()))
        )
    return [_judged(6, problems, f"GPU free {took:.2f} s after the agent's SIGKILL", notes)]


def _wait_quietly(probe: Callable[[], bool], limit_s: float) -> bool:
    """Poll ``probe`` for up to ``limit_s``; its last answer (no error on timeout)."""
    end = time.monotonic() + limit_s
    while not probe():
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
    return True


# --- 7 ---------------------------------------------------------------------------------------


def check_placement(run: Run, deadline: Deadline) -> list[logic.Result]:
    return [_virtual_local_rank(run, deadline), _numa_binding(run, deadline)]


def _virtual_local_rank(run: Run, deadline: Deadline) -> logic.Result:
    m = run.machine
    cuda = ["--cuda-info"] if m.device == "cuda" else []
    job = run.elastic_run(
        "vlr",
        ["--standalone", "--nproc-per-node", m.nproc_gpu, "--virtual-local-rank"],
        ["env", "vlr", *cuda],
    )
    code = job.wait(deadline)
    docs = run.env_docs("vlr")
    problems = [f"exit {code}: {job.tail()}"] if code != 0 else []
    if sorted(docs) != list(range(m.count)):
        problems.append(f"ranks {sorted(docs)} for {m.count} GPUs")
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen: list[str] = []
    notes = []
    for rank, doc in sorted(docs.items()):
        env = doc["env"]
        want = logic.virtual_device(parent, rank)
        if env.get("LOCAL_RANK") != "0":
            problems.append(f"rank {rank}: LOCAL_RANK={env.get('LOCAL_RANK')}")
        if env.get("CUDA_VISIBLE_DEVICES") != want:
            problems.append(
                f"rank {rank}: CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')}, not {want}"
            )
        if cuda:
            devices = doc["devices"]
            if len(devices) != 1:
                problems.append(f"rank {rank} sees {len(devices)} devices")
            seen += [d["pci_bus_id"] for d in devices]
        notes.append(
            f"rank {rank}: CVD={env.get('CUDA_VISIBLE_DEVICES')} "
            f"{'warm' if doc['parent_is_zygote'] else 'cold'} "
            f"cpus {logic.format_cpus(doc['affinity'])}"
        )
    if cuda:
        every = {logic.normalize_pci_bus_id(g.pci_bus_id) for g in m.gpus}
        if len(set(seen)) != len(seen) or not set(seen) <= every:
            problems.append(f"devices seen {seen}, GPUs {sorted(every)}")
    return _judged(7, problems, f"{len(docs)} workers, LOCAL_RANK 0 each", notes, "a")


def _numa_binding(run: Run, deadline: Deadline) -> logic.Result:
    m = run.machine
    if m.device != "cuda":
        return _row(7, "SKIP", "", "--numa-binding needs CUDA", "b")
    if shutil.which("numactl") is None:
        return _row(7, "SKIP", "", "numactl is not installed (apt-get install numactl)", "b")
    job = run.elastic_run(
        "numa",
        ["--standalone", "--nproc-per-node", m.nproc_gpu, "--numa-binding", "node"],
        ["env", "numa", "--cuda-info", "--gpu-pids"],
        {"GPUCHECK_NODE": "numa"},
    )
    code = job.wait(deadline)
    docs = run.env_docs("numa")
    problems = [f"exit {code}: {job.tail()}"] if code != 0 else []
    if sorted(docs) != list(range(m.count)):
        problems.append(f"ranks {sorted(docs)} for {m.count} GPUs")
    allowed = os.sched_getaffinity(0)
    node_root = Path("/sys/devices/system/node")
    lists = {
        int(d.name[4:]): (d / "cpulist").read_text()
        for d in node_root.glob("node[0-9]*")
        if d.name[4:].isdecimal()
    }
    notes = []
    for rank, doc in sorted(docs.items()):
        bus = doc["devices"][int(doc["env"]["LOCAL_RANK"])]["pci_bus_id"]
        node_text = Path("/sys/bus/pci/devices", bus, "numa_node").read_text()
        node, want = logic.numa_node_cpus(node_text, lists, allowed)
        got = set(doc["affinity"])
        if got != want:
            problems.append(
                f"rank {rank} (GPU {bus}, NUMA node {node}): CPUs {logic.format_cpus(got)}, "
                f"expected {logic.format_cpus(want)}"
            )
        notes.append(f"rank {rank}: node {node} cpus {logic.format_cpus(got)}")
        listed = doc.get("gpu_pids")
        if isinstance(listed, list) and job.pid in {p for p, _ in listed}:
            notes.append(f"the agent (pid {job.pid}) holds GPU memory")
    return _judged(7, problems, f"{len(docs)} workers bound", notes, "b")


CHECK_RUNNERS: dict[int, Callable[[Run, Deadline], list[logic.Result]]] = {
    1: check_env,
    2: check_training,
    3: check_worker_kill,
    4: check_two_agents,
    5: check_hang,
    6: check_agent_kill,
    7: check_placement,
}


def run_check(machine: Machine, number: int, root: Path) -> list[logic.Result]:
    """One check under its limit; whatever happens, everything it started is killed."""
    run = Run(machine, number, root)
    # The CPU rehearsal runs on small, shared machines: it gets three times as long.
    deadline = Deadline(TIME_LIMITS_S[number] * (1 if machine.device == "cuda" else 3))
    try:
        rows = CHECK_RUNNERS[number](run, deadline)
    except CheckTimeout as exc:
        rows = [_row(number, "FAIL", "", f"{exc}; {run.last_words()}")]
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        rows = [_row(number, "FAIL", "", f"the check broke: {exc!r}; {run.last_words()}")]
    finally:
        leftovers = run.close()
    if leftovers:
        rows = [
            logic.Result(r.check, r.name, r.verdict, r.figure, f"{r.detail}; killed {leftovers}")
            for r in rows
        ]
    return rows


# What the agents import, and must find: the checkout (PYTHONPATH), the wheels' folder
# (PYTHONPATH) or the machine's own site-packages.
NEEDED_MODULES = (
    "elastic_run", "torch", "click", "psutil", "rich", "grpc", "google.protobuf", "pyetcd",
    "prometheus_client", "typing_extensions",
)  # fmt: skip
_WHERE_PROBE = (
    "import importlib.util as u, json, sys\n"
    "def where(m):\n"
    "    try:\n"
    "        spec = u.find_spec(m)\n"
    "    except ImportError:\n"
    "        return None\n"
    "    return spec.origin if spec is not None else None\n"
    "print(json.dumps({m: where(m) for m in sys.argv[1:]}))\n"
)


def imports_seen(env: dict[str, str]) -> dict[str, str | None]:
    """Where an agent started with ``env`` finds each of :data:`NEEDED_MODULES` (None: not)."""
    done = subprocess.run(
        [sys.executable, "-c", _WHERE_PROBE, *NEEDED_MODULES],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    found: dict[str, str | None] = json.loads(done.stdout)
    return found


def _facts(machine: Machine, imports: dict[str, str | None]) -> dict[str, Any]:
    init = imports.get("elastic_run")
    version = "?"
    if init:
        for line in Path(init).read_text().splitlines():
            if line.startswith("__version__"):
                version = line.split("=", 1)[1].strip().strip("\"'")
    py_spy = shutil.which("py-spy", path=Run.env_path())
    return {
        "gpus": [f"{g.index}: {g.name} ({g.pci_bus_id})" for g in machine.gpus],
        "cuda_devices": machine.count,
        "torch": machine.torch_version,
        "elastic_run": version,
        "python": f"{sys.executable} {sys.version.split()[0]}",
        "imports": imports,
        "py_spy": py_spy,
        "numactl": shutil.which("numactl") is not None,
        "cpus": len(os.sched_getaffinity(0)),
        "device": machine.device,
    }


def _on_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# --- the rehearsal on CPU ---------------------------------------------------------------------

REQUIREMENTS = SCRIPTS / "gpu_check_requirements.txt"


def _torch_pin() -> str:
    """``torch==X`` as constraints.txt pins it (the local CPU wheel on the development machines)."""
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip().startswith("torch=="):
            return line.strip()
    return "torch"


def _step(what: str, argv: list[str], env: dict[str, str] | None = None) -> float:
    """Run one set-up step of the rehearsal; its time. Raises SystemExit(1) when it fails."""
    print(f"gpu_check: rehearsal: {what}: {' '.join(argv)}", flush=True)
    began = time.monotonic()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        print(
            f"Error: rehearsal: {what} failed ({done.returncode}): {' | '.join(tail)}",
            file=sys.stderr,
        )
        raise SystemExit(1)
    return time.monotonic() - began


def rehearse(args: argparse.Namespace, passed: list[str]) -> int:
    """Stand a GPU machine's bare python3 in for itself, on CPU, and run the checks with it.

    A fresh venv holding torch alone (the machine's python3 with its torch), the wheels of
    scripts/gpu_check_requirements.txt put in a folder with ``pip install --no-index --target``
    (downloaded first unless ``--wheels`` gives them), and the checks run by that venv's python
    with ``PYTHONPATH=<folder>:<checkout>``: nothing of the project's own set-up (its .venv,
    setup.sh) is used.
    """
    work = Path(tempfile.mkdtemp(prefix="gpu_check-rehearsal-"))
    venv, site = work / "python3", work / "site"
    python = str(venv / "bin" / "python")
    times: dict[str, float] = {}
    try:
        times["venv"] = _step("a fresh venv", [sys.executable, "-m", "venv", str(venv)])
        times["torch"] = _step("torch alone", [python, "-m", "pip", "install", "-q", _torch_pin()])
        wheels = args.wheels
        if wheels is None:
            wheels = work / "wheels"
            times["download"] = _step(
                "the wheels",
                [python, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(wheels)]
                + ["-r", str(REQUIREMENTS)],
            )
        times["install"] = _step(
            "the wheels, offline",
            [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
            + ["--target", str(site), "-r", str(REQUIREMENTS)],
        )
        print(
            f"gpu_check: rehearsal set-up {json.dumps({k: round(v, 1) for k, v in times.items()})}",
            flush=True,
        )
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
        # Nothing of the project's own environment on PATH: its .venv's programs (py-spy).
        project = str(REPO / ".venv")
        env["PATH"] = os.pathsep.join(
            p for p in env.get("PATH", os.defpath).split(os.pathsep) if not p.startswith(project)
        )
        return subprocess.run(
            [python, str(Path(__file__).resolve()), "--cpu", *passed], env=env
        ).returncode
    finally:
        if args.keep:
            print(f"gpu_check: rehearsal folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py", description="Check elastic-run on this machine's NVIDIA GPUs."
    )
    parser.add_argument("--only", help="run only these checks, e.g. 1,3 (default: all)")
    parser.add_argument("--json", type=Path, help="also write the table as JSON to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--rehearse-on-cpu",
        action="store_true",
        help="rehearse on CPU: a fresh venv with torch alone stands for a GPU machine's python3",
    )
    parser.add_argument(
        "--wheels", type=Path, help="with --rehearse-on-cpu: the wheels' folder (else downloaded)"
    )
    parser.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)  # the rehearsal's run
    args = parser.parse_args(argv)
    try:
        only = logic.parse_only(args.only)
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if args.rehearse_on_cpu and not args.cpu:
        passed = ["--only", args.only] if args.only else []
        passed += ["--json", str(args.json.resolve())] if args.json is not None else []
        passed += ["--keep"] if args.keep else []
        return rehearse(args, passed)
    found = detect(args.cpu)
    if isinstance(found, str):
        print(logic.no_gpu_line(found), flush=True)
        return 0
    imports = imports_seen(Run.plain_env())
    missing = [m for m, where in imports.items() if where is None]
    if missing:
        print(
            f"Error: the agents cannot import {', '.join(missing)}: put the wheels' folder on "
            "PYTHONPATH (docs/gpu-check.md)",
            file=sys.stderr,
        )
        return 2
    facts = _facts(found, imports)
    print(f"gpu_check: {json.dumps(facts)}", flush=True)
    signal.signal(signal.SIGTERM, _on_signal)
    root = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    results: list[logic.Result] = []
    began = time.monotonic()
    try:
        for number in only:
            for row in run_check(found, number, root):
                results.append(row)
                print(logic.verdict_line(row), flush=True)
    except KeyboardInterrupt:  # the check's processes are killed by then
        print(f"gpu_check: interrupted; work directory kept: {root}", file=sys.stderr)
        return 130
    facts["total_s"] = round(time.monotonic() - began, 1)
    print()
    print(logic.render_table(results))
    print(f"\ntotal {facts['total_s']} s")
    if args.json is not None:
        args.json.write_text(json.dumps(logic.results_document(results, facts), indent=2) + "\n")
    code = logic.exit_code(results)
    if args.keep or code:
        print(f"work directory kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
