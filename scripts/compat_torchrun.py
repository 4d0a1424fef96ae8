"""Run the same invocations under torchrun and elastic-run (one venv); fail on an unlisted difference.

For every case of the matrix, both launchers run the worker ``compat_workers/dump_env.py`` (it
dumps its environment to a file and prints one line to stdout and one to stderr) with the same
flags, in the same base environment, and the script compares:

    exit codes           torchrun's and ours
    workers              which ranks ran, in which restart
    env                  the keys the launcher gave the workers (set or changed against the base
                         environment), with run-specific values normalized (ports, run ids,
                         random log-dir suffixes, the temp directory, the host name, pids)
    log tree             the files under --log-dir, normalized the same way
    stdout, stderr       the launchers' lines, normalized (torch's logging prefixes and our event
                         timestamps reduced to their text)

Every difference found must match an entry of ``DELIBERATE``, each of which names its row of the
README's table "Where elastic-run differs from torchrun, and why"; the rest are printed as
``UNEXPECTED``. Before anything runs, the script lists torchrun's flags from torch's own parser
(``torch.distributed.run.get_args_parser()``) and checks that some case of the full matrix passes
each of them, and that each ``DELIBERATE`` entry names a row the README has.

Exit status: 0 when every difference is listed; 1 when one is not, when a torchrun flag is in no
case, or when an entry names no README row; 2 on bad usage. ``--inject-difference`` gives the
workers under elastic-run one variable more (``COMPAT_INJECTED=1``), as a launcher that differs
would: the same comparison must then report it and exit 1 (the test suite checks that).

Cases run two at a time; the whole matrix takes a few minutes on a small machine, ``--quick``
(the cases the test suite runs) under a minute.

    .venv/bin/python scripts/compat_torchrun.py                 # every case
    .venv/bin/python scripts/compat_torchrun.py --quick         # the test suite's few cases
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
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_SECTION = "### Where elastic-run differs from torchrun, and why"
WORKERS = Path(__file__).resolve().parent / "compat_workers"
WORKER = WORKERS / "dump_env.py"
LAUNCHERS = {"torchrun": str(BIN / "torchrun"), "elastic-run": str(BIN / "elastic-run")}
INJECTED = "COMPAT_INJECTED"


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
    timeout_s: float = 300.0  # then the launcher is killed (SIGKILL to its process group)
    sigterm: int = 0  # SIGTERM each launcher once this many workers dumped their environment
    quick: bool = False  # one of the --quick cases (the test suite's)


def cases() -> list[Case]:
    """The full matrix; together its cases pass every torchrun flag (see ``uncovered_flags``)."""
    one = ["--standalone", "--nproc-per-node", "1"]
    two = ["--standalone", "--nproc-per-node", "2"]
    logs = ["--log-dir", "{logs}"]
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:{port}", "--rdzv-id", "{id}"]
    static = ["--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", "{port}"]
    return [
        Case("env one worker", [one]),
        Case("env two workers (OMP notice)", [two], quick=True),
        Case(
            "static two nodes", [[*static, "--nnodes", "2", "--node-rank", str(r)] for r in (0, 1)]
        ),
        Case("c10d two nodes", [[*c10d, "--nnodes", "2", "--local-addr", "127.0.0.1"]] * 2),
        Case("failing worker", [[*two, *logs, "--max-restarts", "1"]], env={"COMPAT_FAIL": "1"}),
        Case(
            "failing worker, TORCHELASTIC_ERROR_FILE set",
            [[*two, *logs]],
            env={"COMPAT_FAIL": "1", "TORCHELASTIC_ERROR_FILE": "{tmp}/agent-error.json"},
            quick=True,
        ),
        Case("log-dir reuse", [[*c10d, "--nnodes", "1", *logs]], runs=2),
        Case("--tee 3", [[*two, *logs, "--tee", "3"]]),
        Case("--redirects 3", [[*two, *logs, "--redirects", "3"]]),
        Case("-t 3 -r 3 (short flags)", [[*two, *logs, "-t", "3", "-r", "3"]]),
        Case("--redirect=3 (prefix)", [[*two, *logs, "--redirect=3"]]),
        Case(
            "--local-ranks-filter 0 --tee 3",
            [[*two, *logs, "--tee", "3", "--local-ranks-filter", "0"]],
        ),
        Case("-m module", [[*one, "-m"]], program=["dump_env"]),
        Case("--no-python", [[*one, "--no-python"]], program=[sys.executable, str(WORKER)]),
        Case("--run-path", [[*one, "--run-path"]]),
        Case("--run-path --start-method fork", [[*one, "--run-path", "--start-method", "fork"]]),
        Case("--role trainer", [[*one, "--role", "trainer"]]),
        Case("--monitor-interval 0.5", [[*one, "--monitor-interval", "0.5"]]),
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
        Case(
            "SIGTERM, --signals-to-handle SIGTERM,SIGINT --shutdown-timeout 5",
            [[*two, "--signals-to-handle", "SIGTERM,SIGINT", "--shutdown-timeout", "5"]],
            env={"COMPAT_WAIT": "1"},
            sigterm=2,
        ),
        # torchrun waits forever there: it is killed after timeout_s, by which time ours finished.
        Case("--standalone --nnodes 2", [["--standalone", "--nnodes", "2"]], timeout_s=120.0),
    ]


# ---- what may differ: each entry names its row of the README's table ------------------------


@dataclass(frozen=True)
class Deliberate:
    """A difference the README lists: ``pattern`` (a regex) must match a difference's whole text.

    ``row`` is the start of the row's first cell in the README's table; ``aspect`` the part of
    the comparison; ``cases`` the case names it may appear in (empty: any case).
    """

    row: str
    aspect: str
    pattern: str
    cases: tuple[str, ...] = ()


_SIGTERM_CASES = (
    "SIGTERM to the launcher",
    "SIGTERM, --signals-to-handle SIGTERM,SIGINT --shutdown-timeout 5",
)
_BAD_FLAG_CASES = ("--nproc-per-node xpu", "--numa-binding node")
_FAILING_CASES = ("failing worker", "failing worker, TORCHELASTIC_ERROR_FILE set")
_C10D_CASES = ("c10d two nodes", "log-dir reuse")
_STANDALONE_2 = ("--standalone --nnodes 2",)
# A Python traceback as torchrun prints it on its stderr (its own, on a failure or a signal).
_TRACEBACK = (
    r"- (Traceback \(most recent call last\):|  File \".*\", line \d+, in .*|    .*|\s*"
    r"|\s*[\w.]+(Error|Exception)(: .*)?|The above exception was the direct cause of .*)"
)
_TORCH_LOG = r"- torch/distributed/[\w/]+\.py:\d+\] .*"  # torch's logging (glog prefix cut)

DELIBERATE: tuple[Deliberate, ...] = (
    Deliberate("the agent's own output", "stderr", r"\+ elastic-run\[[^\]]+\] [a-z_.]+: .*"),
    Deliberate("the agent's own output", "stderr", _TORCH_LOG),
    Deliberate("the agent's own output", "stderr", r"\+ elastic-run: goodput .*"),
    Deliberate(
        "extra files in the log tree", "log tree", r"\+ logs/.+/(events\.jsonl|stacks\.txt)"
    ),
    Deliberate(
        "extra worker variables",
        "env",
        r"ELASTIC_RUN_(GUARDIAN|PROGRESS_FILE|PROGRESS_SLOT|AUTO_PROGRESS): torchrun None, "
        r"elastic-run '.+'",
    ),
    Deliberate(
        "OMP_NUM_THREADS notice",
        "stderr",
        r"- torch/distributed/run\.py:\d+\]\s*(\*+|Setting OMP_NUM_THREADS .*)?",
    ),
    Deliberate(
        "OMP_NUM_THREADS notice", "stderr", r"\+ elastic-run: OMP_NUM_THREADS is set to 1 .*"
    ),
    Deliberate(
        "launcher stopped by signal N",
        "exit codes",
        r"torchrun \[1(, 1)*\], elastic-run \[143(, 143)*\]",
        _SIGTERM_CASES,
    ),
    Deliberate("launcher stopped by signal N", "stderr", _TRACEBACK, _SIGTERM_CASES),
    Deliberate(
        "launcher stopped by signal N", "stderr", r"\+ Error: stopped by SIGTERM", _SIGTERM_CASES
    ),
    Deliberate(
        "bad flag values", "exit codes", r"torchrun \[1\], elastic-run \[2\]", _BAD_FLAG_CASES
    ),
    Deliberate("bad flag values", "stderr", _TRACEBACK, _BAD_FLAG_CASES),
    Deliberate("bad flag values", "stderr", r"- torch/numa/binding\.py:\d+\] .*", _BAD_FLAG_CASES),
    Deliberate("bad flag values", "stderr", r"\+ Error: .+", _BAD_FLAG_CASES),
    Deliberate("a failed job's summary", "stderr", _TRACEBACK, _FAILING_CASES),
    Deliberate(
        "a failed job's summary",
        "stderr",
        r"- (=+|-+|\S+ FAILED|Failures:|  <NO_OTHER_FAILURES>|Root Cause \(first observed "
        r"failure\):|\[\d+\]:|  (time|host|rank|exitcode|error_file|traceback)\s*: .*)\s*",
        _FAILING_CASES,
    ),
    Deliberate(
        "a failed job's summary",
        "stderr",
        r"\+ (run '.+' failed: .+|[╭│╰].*|elastic-run: logs in .+)",
        _FAILING_CASES,
    ),
    Deliberate(
        "how a Python worker starts",
        "stderr",
        r"\+\s+(File \".*/elastic_run/agent/warm/zygote_process\.py\", line \d+, in <module>"
        r"|runpy\.run_path\(sys\.argv\[0\], run_name=\"__main__\"\)"
        r"|File \"<frozen runpy>\", line \d+, in \w+)",
    ),
    Deliberate(
        "a torch `--rdzv-conf` key",
        "stderr",
        r"\+ elastic-run: WARNING: --rdzv-conf no_such_key: unknown key \(ignored\).*",
        ("--rdzv-conf unknown key",),
    ),
    Deliberate(
        "`--standalone --nnodes 2`",
        "exit codes",
        r"torchrun \[-9\], elastic-run \[0\]",
        _STANDALONE_2,
    ),
    Deliberate(
        "`--standalone --nnodes 2`",
        "workers",
        r"torchrun \[\], elastic-run \['0/0'\]",
        _STANDALONE_2,
    ),
    Deliberate(
        "`--standalone --nnodes 2`",
        "stderr",
        r"- \[compat: killed after \d+ s\]|- |\+ elastic-run: --standalone runs a single node: "
        r"--nnodes is set to 1|\+ err from rank 0",
        _STANDALONE_2,
    ),
    Deliberate("`--standalone --nnodes 2`", "stdout", r"\+ out from rank 0", _STANDALONE_2),
    Deliberate(
        "a clean two-node c10d shutdown",
        "stderr",
        r"- (.*(recvVector|recvBytes|recvValue|TCPStore|Connection reset by peer|Broken pipe).*"
        r"|frame #\d+: .*|Exception raised from .*)",
        _C10D_CASES,
    ),
)


@dataclass(frozen=True)
class Difference:
    """One thing that differs between the launchers in one case."""

    case: str
    aspect: str  # "exit codes", "workers", "env", "log tree", "stdout" or "stderr"
    text: str

    def listed_by(self, deliberate: Iterable[Deliberate]) -> Deliberate | None:
        """The first entry of ``deliberate`` that allows this difference, if any."""
        for entry in deliberate:
            if (
                entry.aspect == self.aspect
                and (not entry.cases or self.case in entry.cases)
                and re.fullmatch(entry.pattern, self.text)
            ):
                return entry
        return None


def readme_rows(readme: Path = README) -> list[str]:
    """The first cells of the README's table of deliberate differences (header excluded)."""
    text = readme.read_text()
    start = text.index(README_SECTION)
    end = text.find("\n## ", start)
    section = text[start : end if end >= 0 else len(text)]
    rows = [line[2:].split(" | ")[0] for line in section.splitlines() if line.startswith("| ")]
    return rows[1:]


def unknown_rows(deliberate: Iterable[Deliberate], rows: Sequence[str]) -> list[str]:
    """Entries of ``deliberate`` whose ``row`` starts no row, or more than one, of ``rows``."""
    return sorted({e.row for e in deliberate if sum(r.startswith(e.row) for r in rows) != 1})


def torchrun_flags() -> dict[str, tuple[str, ...]]:
    """torchrun's flags, from its own parser: destination -> option strings (help left out)."""
    from torch.distributed.run import get_args_parser

    # argparse lists a parser's actions only in this attribute; there is no public accessor.
    actions = get_args_parser()._actions
    return {
        a.dest: tuple(a.option_strings) for a in actions if a.option_strings and a.dest != "help"
    }


def uncovered_flags(matrix: Iterable[Case], flags: dict[str, tuple[str, ...]]) -> list[str]:
    """Flags of ``flags`` that no case of ``matrix`` passes (spelled out, as ``--x`` or ``--x=v``)."""
    used = {
        arg.split("=", 1)[0]
        for case in matrix
        for node in case.nodes
        for arg in node
        if arg.startswith("-")
    }
    return sorted(strings[0] for strings in flags.values() if not used & set(strings))


# ---- running one case under both launchers ------------------------------------------------


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
        (r"<tmp>/torchelastic_[A-Za-z0-9_]{8}", "<default-log-dir>"),  # TMPDIR is <tmp>
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
        time.sleep(0.1)  # a poll of the workers' files, which nothing signals


def _launch(
    launcher: str, case: Case, root: Path, base_env: dict[str, str], inject: bool
) -> Outcome:
    tmp = root / launcher
    tmp.mkdir()
    out, logs = tmp / "out", tmp / "logs"
    out.mkdir()
    port, run_id = free_port(), f"compat{uuid.uuid4().hex[:6]}"
    # The launchers' temp folder is the case's own (removed with it): a default log folder
    # (torchelastic_*) is never left behind.
    env = dict(base_env, COMPAT_OUT=str(out), TMPDIR=str(tmp))
    env.update({k: v.format(tmp=tmp) for k, v in case.env.items()})
    if inject and launcher == "elastic-run":
        env[INJECTED] = "1"  # as if elastic-run gave its workers one variable more
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


# ---- comparing -----------------------------------------------------------------------------


def _lines_only_in_one(theirs: list[str], ours: list[str]) -> list[str]:
    return [f"- {x}" for x in theirs if x not in ours] + [f"+ {x}" for x in ours if x not in theirs]


def _env_differences(
    theirs: dict[str, dict[str, str]], ours: dict[str, dict[str, str]]
) -> list[str]:
    found: set[str] = set()
    for key in sorted(set(theirs) & set(ours)):
        t, o = theirs[key], ours[key]
        for name in sorted(set(t) | set(o)):
            if t.get(name) != o.get(name):
                found.add(f"{name}: torchrun {t.get(name)!r}, elastic-run {o.get(name)!r}")
    return sorted(found)


def compare(case: Case, t: Outcome, o: Outcome) -> list[Difference]:
    """Every difference between torchrun's outcome ``t`` and ours ``o`` in ``case``."""
    found = []
    if t.codes != o.codes:
        found.append(f"exit codes|torchrun {t.codes}, elastic-run {o.codes}")
    if sorted(t.env) != sorted(o.env):
        found.append(f"workers|torchrun {sorted(t.env)}, elastic-run {sorted(o.env)}")
    found += [f"env|{text}" for text in _env_differences(t.env, o.env)]
    found += [f"log tree|{text}" for text in _lines_only_in_one(t.tree, o.tree)]
    found += [f"stdout|{text}" for text in _lines_only_in_one(t.stdout, o.stdout)]
    found += [f"stderr|{text}" for text in _lines_only_in_one(t.stderr, o.stderr)]
    return [Difference(case.name, *item.split("|", 1)) for item in found]


def report(case: Case, t: Outcome, o: Outcome, differences: list[Difference]) -> str:
    """The case's block of the printed report: each difference with its README row or not."""
    lines = [f"=== {case.name}   (torchrun {t.seconds:.1f} s, elastic-run {o.seconds:.1f} s)"]
    lines.append(f"  exit codes: torchrun {t.codes}, elastic-run {o.codes}")
    lines.append(
        f"  workers: {len(t.env)} under torchrun, {len(o.env)} under elastic-run; "
        f"{len(differences)} differences"
    )
    for d in differences:
        entry = d.listed_by(DELIBERATE)
        mark = f"[README: {entry.row[:40]}]" if entry else "UNEXPECTED"
        text = d.text if len(d.text) <= 160 else d.text[:157] + "..."
        lines.append(f"  {d.aspect}: {text}  {mark}")
    return "\n".join(lines)


def _run_case(case: Case, base_env: dict[str, str], inject: bool) -> tuple[str, list[Difference]]:
    root = Path(tempfile.mkdtemp(prefix="compat-"))
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = {
                name: pool.submit(_launch, name, case, root, base_env, inject) for name in LAUNCHERS
            }
            results = {name: f.result() for name, f in futures.items()}
        t, o = results["torchrun"], results["elastic-run"]
        differences = compare(case, t, o)
        return report(case, t, o, differences), differences
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _base_env() -> dict[str, str]:
    base_env = dict(os.environ)
    for name in list(base_env):
        if name.startswith(("TORCHELASTIC_", "ELASTIC_RUN_", "PET_")) or name in (
            "OMP_NUM_THREADS",
            INJECTED,
        ):
            del base_env[name]
    base_env["PYTHONPATH"] = os.pathsep.join([str(WORKERS), base_env.get("PYTHONPATH", "")])
    return base_env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-k", action="append", default=[], help="run cases whose name has this")
    parser.add_argument("--quick", action="store_true", help="only the test suite's few cases")
    parser.add_argument(
        "--parallel", type=int, default=2, help="cases at a time (2 launchers each)"
    )
    parser.add_argument(
        "--inject-difference",
        action="store_true",
        help=f"give elastic-run's workers {INJECTED}=1 (the run must then fail)",
    )
    args = parser.parse_args(argv)
    matrix = cases()
    problems = [
        f"torchrun flag {flag} is passed by no case"
        for flag in uncovered_flags(matrix, torchrun_flags())
    ]
    problems += [
        f"DELIBERATE names no single row of the README's table: {row!r}"
        for row in unknown_rows(DELIBERATE, readme_rows())
    ]
    for problem in problems:
        print(f"error: {problem}", flush=True)
    chosen = [
        c
        for c in matrix
        if (c.quick or not args.quick) and (not args.k or any(k in c.name for k in args.k))
    ]
    if not chosen:
        print(f"error: no case matches -k {args.k}{' among --quick' if args.quick else ''}")
        return 2
    started = time.monotonic()
    print(f"torch launcher: {LAUNCHERS['torchrun']}\nours: {LAUNCHERS['elastic-run']}", flush=True)
    differences: list[Difference] = []
    with ThreadPoolExecutor(args.parallel) as pool:
        for text, found in pool.map(
            lambda c: _run_case(c, _base_env(), args.inject_difference), chosen
        ):
            print(text, flush=True)
            differences += found
    unexpected = [d for d in differences if d.listed_by(DELIBERATE) is None]
    print(
        f"{len(chosen)} cases in {time.monotonic() - started:.0f} s: {len(differences)} "
        f"differences, {len(unexpected)} not in the README's table"
    )
    for d in unexpected:
        print(f"UNEXPECTED: {d.case} / {d.aspect}: {d.text}")
    return 1 if unexpected or problems else 0


if __name__ == "__main__":
    sys.exit(main())
