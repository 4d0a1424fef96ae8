"""Run the same invocations under torchrun and elastic-run (one venv) and print what differs.

For every case of the matrix, both launchers run the worker ``compat_workers/dump_env.py`` (it
dumps its environment to a file and prints one line to stdout and one to stderr) with the same
flags, in the same base environment, and the script prints:

    exit codes           torchrun's and ours
    environment diff     the keys the launcher gave the workers (set or changed against the base
                         environment), with run-specific values normalized (ports, run ids,
                         random log-dir suffixes, the temp directory, the host name, pids)
    log tree diff        the files under --log-dir, normalized the same way
    console diff         the launchers' stdout and stderr lines, normalized (torch's logging
                         prefixes and our event timestamps reduced to their text)

A flag one launcher rejects shows as its exit code and its error line. Cases run four at a time;
the whole matrix takes a few minutes on a small machine.

    .venv/bin/python scripts/compat_torchrun.py                 # every case
    .venv/bin/python scripts/compat_torchrun.py -k c10d -k env  # cases whose name has a word
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
WORKERS = Path(__file__).resolve().parent / "compat_workers"
WORKER = WORKERS / "dump_env.py"
LAUNCHERS = {"torchrun": str(BIN / "torchrun"), "elastic-run": str(BIN / "elastic-run")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Case:
    """One invocation: its flags per node (``{port}``, ``{id}``, ``{logs}`` are filled in)."""

    name: str
    nodes: list[list[str]]
    program: list[str] = field(default_factory=lambda: [str(WORKER)])
    env: dict[str, str] = field(default_factory=dict)
    runs: int = 1  # run the whole invocation this many times (--log-dir reuse)
    timeout_s: float = 90.0  # then the launcher is killed (SIGKILL to its process group)
    sigterm: int = 0  # SIGTERM each launcher once this many workers dumped their environment


def _cases() -> list[Case]:
    one = ["--standalone", "--nproc-per-node", "1"]
    two = ["--standalone", "--nproc-per-node", "2"]
    logs = ["--log-dir", "{logs}"]
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:{port}", "--rdzv-id", "{id}"]
    static = ["--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", "{port}"]
    cases = [
        Case("env one worker", [one]),
        Case("env two workers (OMP notice)", [two]),
        Case(
            "static two nodes", [[*static, "--nnodes", "2", "--node-rank", str(r)] for r in (0, 1)]
        ),
        Case("c10d two nodes", [[*c10d, "--nnodes", "2", "--local-addr", "127.0.0.1"]] * 2),
        Case("failing worker", [[*two, *logs, "--max-restarts", "1"]], env={"COMPAT_FAIL": "1"}),
        Case(
            "failing worker, TORCHELASTIC_ERROR_FILE set",
            [[*two, *logs]],
            env={"COMPAT_FAIL": "1", "TORCHELASTIC_ERROR_FILE": "{tmp}/agent-error.json"},
        ),
        Case("log-dir reuse", [[*c10d, "--nnodes", "1", *logs]], runs=2),
        Case("--tee 3", [[*two, *logs, "--tee", "3"]]),
        Case("--redirects 3", [[*two, *logs, "--redirects", "3"]]),
        Case("--redirect=3 (prefix)", [[*two, *logs, "--redirect=3"]]),
        Case(
            "--local-ranks-filter 0 --tee 3",
            [[*two, *logs, "--tee", "3", "--local-ranks-filter", "0"]],
        ),
        Case("-m module", [[*one, "-m"]], program=["dump_env"]),
        Case("--no-python", [[*one, "--no-python"]], program=[sys.executable, str(WORKER)]),
        Case("--logs-specs default", [[*one, "--logs-specs", "default"]]),
        Case("--virtual-local-rank", [[*two, "--virtual-local-rank"]]),
        Case("--numa-binding node", [[*one, "--numa-binding", "node"]]),
        Case("--event-log-handler null", [[*one, "--event-log-handler", "null"]]),
        Case("--duplicate-stdout-filters", [[*one, *logs, "--duplicate-stdout-filters", "rank"]]),
        Case("--duplicate-stderr-filters", [[*one, *logs, "--duplicate-stderr-filters", "rank"]]),
        Case("--nproc-per-node xpu", [["--standalone", "--nproc-per-node", "xpu"]]),
        Case("--rdzv-conf unknown key", [[*one, "--rdzv-conf", "no_such_key=1"]]),
        Case("static --rdzv-conf join_timeout", [[*static, "--rdzv-conf", "join_timeout=30"]]),
        Case("SIGTERM to the launcher", [two], env={"COMPAT_WAIT": "1"}, sigterm=2),
        Case("--standalone --nnodes 2", [["--standalone", "--nnodes", "2"]], timeout_s=20.0),
    ]
    return cases


@dataclass
class Outcome:
    codes: list[int]
    env: dict[str, dict[str, str]]  # "rank/restart" -> launcher-given keys
    tree: list[str]
    stdout: list[str]
    stderr: list[str]
    seconds: float


def _normalizer(tmp: Path, run_id: str, port: int) -> Callable[[str], str]:
    host, fqdn = socket.gethostname(), socket.getfqdn()
    rules = [
        (re.escape(str(tmp)), "<tmp>"),
        (re.escape(run_id) + r"_[A-Za-z0-9_]{8}", "<run-id>_<rand>"),
        (re.escape(run_id), "<run-id>"),
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(_[A-Za-z0-9_]{8})?",
            "<uuid>",
        ),
        (r"\b" + str(port) + r"\b", "<port>"),
        (r"/tmp/torchelastic_[A-Za-z0-9_]{8}", "<default-log-dir>"),
        (r"\b(\w+)_[A-Za-z0-9_]{8}/attempt_", r"\1_<rand>/attempt_"),
        (r"elastic-run-\d+-\d+-[0-9a-f]{8}", "elastic-run-<pid>-<n>-<rand>"),
        (r"\b[A-Z]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ ", ""),  # glog prefix (torch's C++ warnings)
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", ""),  # our event timestamps
        (r"\bpid[ =:]?\d+", "pid<pid>"),
        (r"\b\d{4}-\d\d-\d\d[ _]\d\d:\d\d:\d\d(,\d+)?", "<time>"),
    ]
    for name in {fqdn, host}:
        if name and name != "localhost":
            rules.append((r"\b" + re.escape(name) + r"\b", "<host>"))

    def normalize(text: str) -> str:
        for pattern, repl in rules:
            text = re.sub(pattern, repl, text)
        return text

    return normalize


def _wait_for_workers(out: Path, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(out.glob("env-*.json"))) < count and time.monotonic() < deadline:
        time.sleep(0.1)


def _launch(launcher: str, case: Case, root: Path, base_env: dict[str, str]) -> Outcome:
    tmp = root / launcher
    tmp.mkdir()
    out, logs = tmp / "out", tmp / "logs"
    out.mkdir()
    port, run_id = free_port(), f"compat{uuid.uuid4().hex[:6]}"
    env = dict(base_env, COMPAT_OUT=str(out))
    env.update({k: v.format(tmp=tmp) for k, v in case.env.items()})
    fill = {"port": port, "id": run_id, "logs": logs, "tmp": tmp}
    codes: list[int] = []
    stdout: list[str] = []
    stderr: list[str] = []
    started = time.monotonic()
    for _ in range(case.runs):
        procs = []
        for node in case.nodes:
            argv = [LAUNCHERS[launcher], *(a.format(**fill) for a in node), *case.program]
            procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=tmp,
                    start_new_session=True,
                )
            )
        if case.sigterm:
            _wait_for_workers(out, case.sigterm, case.timeout_s)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                o, e = proc.communicate(timeout=case.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                o, e = proc.communicate()
                e += f"\n[compat: killed after {case.timeout_s:g} s]"
            codes.append(proc.returncode)
            stdout += o.splitlines()
            stderr += e.splitlines()
    seconds = time.monotonic() - started
    norm = _normalizer(tmp, run_id, port)
    given: dict[str, dict[str, str]] = {}
    for path in sorted(out.glob("env-*.json")):
        seen = json.loads(path.read_text())
        key = "/".join(path.stem.split("-")[1:3])
        given[key] = {
            k: "<port>" if k.endswith("_PORT") and v.isdigit() else norm(v)
            for k, v in seen.items()
            if base_env.get(k) != v and k != "COMPAT_OUT"
        }
    tree = sorted(norm(str(p.relative_to(tmp))) for p in logs.rglob("*") if p.is_file())
    if case.env.get("TORCHELASTIC_ERROR_FILE"):
        agent_file = Path(case.env["TORCHELASTIC_ERROR_FILE"].format(tmp=tmp))
        tree.append(f"(agent error file {'written' if agent_file.exists() else 'not written'})")
    return Outcome(
        codes,
        given,
        tree,
        [norm(line) for line in stdout],
        [norm(line) for line in stderr],
        seconds,
    )


def _side_by_side(title: str, theirs: list[str], ours: list[str], limit: int = 12) -> list[str]:
    only_t = [x for x in theirs if x not in ours]
    only_o = [x for x in ours if x not in theirs]
    if not only_t and not only_o:
        return [f"  {title}: same"]
    lines = [f"  {title}: {len(only_t)} only under torchrun, {len(only_o)} only under elastic-run"]
    lines += [f"    - {x}" for x in only_t[:limit]]
    lines += [f"    - ... {len(only_t) - limit} more" for _ in range(1) if len(only_t) > limit]
    lines += [f"    + {x}" for x in only_o[:limit]]
    lines += [f"    + ... {len(only_o) - limit} more" for _ in range(1) if len(only_o) > limit]
    return lines


def _env_diff(theirs: dict[str, dict[str, str]], ours: dict[str, dict[str, str]]) -> list[str]:
    if not theirs and not ours:
        return ["  env: no worker ran under either"]
    if not theirs or not ours:
        who = "torchrun" if not theirs else "elastic-run"
        return [f"  env: no worker ran under {who}"]
    lines = []
    ranks_t, ranks_o = sorted(theirs), sorted(ours)
    if ranks_t != ranks_o:
        lines.append(f"  env: workers (rank/restart) torchrun {ranks_t}, elastic-run {ranks_o}")
    diffs = set()
    for key in sorted(set(ranks_t) & set(ranks_o)):
        t, o = theirs[key], ours[key]
        for name in sorted(set(t) | set(o)):
            if t.get(name) != o.get(name):
                diffs.add(f"{name}: torchrun {t.get(name)!r}, elastic-run {o.get(name)!r}")
    if not diffs:
        lines.append(f"  env: same ({len(theirs[ranks_t[0]])} launcher-given keys)")
    else:
        lines.append(f"  env: {len(diffs)} differences")
        lines += [f"    {d}" for d in sorted(diffs)]
    return lines


def _report(case: Case, t: Outcome, o: Outcome) -> str:
    lines = [f"=== {case.name}   (torchrun {t.seconds:.1f} s, elastic-run {o.seconds:.1f} s)"]
    same = "same" if t.codes == o.codes else "DIFFERENT"
    lines.append(f"  exit codes: torchrun {t.codes}, elastic-run {o.codes} ({same})")
    lines += _env_diff(t.env, o.env)
    lines += _side_by_side("log tree", t.tree, o.tree)
    lines += _side_by_side("stdout", t.stdout, o.stdout)
    lines += _side_by_side("stderr", t.stderr, o.stderr)
    return "\n".join(lines)


def _run_case(case: Case, base_env: dict[str, str]) -> str:
    root = Path(tempfile.mkdtemp(prefix="compat-"))
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = {name: pool.submit(_launch, name, case, root, base_env) for name in LAUNCHERS}
            results = {name: f.result() for name, f in futures.items()}
        return _report(case, results["torchrun"], results["elastic-run"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", action="append", default=[], help="run cases whose name has this")
    parser.add_argument(
        "--parallel", type=int, default=2, help="cases at a time (2 launchers each)"
    )
    args = parser.parse_args()
    cases = [c for c in _cases() if not args.k or any(k in c.name for k in args.k)]
    base_env = dict(os.environ)
    for name in list(base_env):
        if name.startswith(("TORCHELASTIC_", "ELASTIC_RUN_")) or name in ("OMP_NUM_THREADS",):
            del base_env[name]
    base_env["PYTHONPATH"] = os.pathsep.join([str(WORKERS), base_env.get("PYTHONPATH", "")])
    started = time.monotonic()
    print(f"torch launcher: {LAUNCHERS['torchrun']}\nours: {LAUNCHERS['elastic-run']}", flush=True)
    with ThreadPoolExecutor(args.parallel) as pool:
        for text in pool.map(lambda c: _run_case(c, base_env), cases):
            print(text, flush=True)
    print(f"{len(cases)} cases in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
