"""The pure part of scripts/gpu_check.py: parsing, comparing, judging, the table. No I/O.

Everything here is a function of its arguments (nvidia-smi's text, environments, records the
workers wrote, the contents of sysfs files read by the caller), so that tests/unit/
test_gpu_check.py checks it on a machine without a GPU. The script that runs the checks
(processes, nvidia-smi, signals) is scripts/gpu_check.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "CHECKS",
    "ComputeApp",
    "Gpu",
    "IGNORED_ENV_KEYS",
    "IGNORED_ENV_PREFIXES",
    "Result",
    "env_differences",
    "exit_code",
    "first_step_after",
    "format_cpus",
    "no_gpu_line",
    "normalize_pci_bus_id",
    "numa_node_cpus",
    "parse_compute_apps",
    "parse_cpu_list",
    "parse_gpus",
    "parse_only",
    "parse_records",
    "render_table",
    "requirements_of",
    "results_document",
    "sandbox_refusal",
    "verdict_of",
    "smi_absence",
    "torch_absence",
    "verdict_line",
    "virtual_device",
]

CHECKS: dict[int, str] = {
    1: "nproc-per-node gpu, env as torchrun's",
    2: "CUDA training, warm and cold, zygote CUDA-free",
    3: "worker SIGKILL, warm restart, memory freed",
    4: "two agents on one GPU (gloo, CUDA tensors), one SIGKILLed",
    5: "rank stuck in a CUDA kernel, hang verdict, stacks",
    6: "agent SIGKILL frees the GPU within 5 s",
    7: "virtual local rank and NUMA binding",
}
"""Check number -> its short title (the table's and --only's numbers)."""

IGNORED_ENV_KEYS = frozenset({"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"})
"""Worker variables whose values differ by nature between two launches (a free port, a random
run id, a path under each launcher's own log directory)."""

IGNORED_ENV_PREFIXES = ("ELASTIC_RUN_",)
"""elastic-run's documented extras (the guardian token, the progress-beat slot)."""

_VERDICTS = ("PASS", "FAIL", "SKIP")
_NOT_A_NUMBER = ("[N/A]", "[Not Supported]", "N/A", "")


@dataclass(frozen=True)
class Result:
    """One row of the table.

    Attributes:
        check: the check's id in the table ("3", or "7a" for a part of check 7).
        name: what it checks, in a few words.
        verdict: PASS, FAIL or SKIP.
        figure: the measured figure ("1.24 s kill -> training again"), or "".
        detail: what was seen, or why it failed or was skipped.
    """

    check: str
    name: str
    verdict: str
    figure: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in _VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(_VERDICTS)}")


@dataclass(frozen=True)
class Gpu:
    """One line of ``nvidia-smi --query-gpu=index,name,pci.bus_id,uuid,memory.used``."""

    index: int
    name: str
    pci_bus_id: str
    uuid: str
    memory_used_mib: int | None


@dataclass(frozen=True)
class ComputeApp:
    """One line of ``nvidia-smi --query-compute-apps=pid,used_memory``."""

    pid: int
    used_mib: int | None


def _csv_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.lower().startswith("no running"):
            continue
        rows.append([cell.strip() for cell in line.split(",")])
    return rows


def _int_or_none(cell: str) -> int | None:
    if cell in _NOT_A_NUMBER:
        return None
    return int(float(cell))


def parse_gpus(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=index,name,pci.bus_id,uuid,memory.used
    --format=csv,noheader,nounits``.

    Raises:
        ValueError: a line that is not five fields with a number first.
    """
    gpus = []
    for row in _csv_rows(text):
        if len(row) < 5:
            raise ValueError(f"nvidia-smi --query-gpu line has {len(row)} fields: {row!r}")
        # A GPU's name may hold a comma: the fixed fields are the first and the last three.
        index, *name, bus, uuid, used = row
        gpus.append(Gpu(int(index), ", ".join(name), bus, uuid, _int_or_none(used)))
    return gpus


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """Parse ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``.

    Raises:
        ValueError: a line that is not a pid and a memory figure.
    """
    apps = []
    for row in _csv_rows(text):
        if len(row) != 2:
            raise ValueError(f"nvidia-smi --query-compute-apps line has {len(row)} fields: {row!r}")
        apps.append(ComputeApp(int(row[0]), _int_or_none(row[1])))
    return apps


def normalize_pci_bus_id(bus_id: str) -> str:
    """nvidia-smi's ``00000000:19:00.0`` -> sysfs's ``0000:19:00.0`` (lower case)."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        raise ValueError(f"{bus_id!r} is not a PCI bus id")
    return f"{int(domain, 16):04x}:{rest}"


def parse_cpu_list(text: str) -> set[int]:
    """A sysfs CPU list (``0-3,8,10-11``) -> the set of CPUs."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def numa_node_cpus(
    numa_node_text: str, node_cpulists: Mapping[int, str], allowed: Iterable[int]
) -> tuple[int, set[int]]:
    """The CPUs ``--numa-binding node`` should give the worker of a GPU: every CPU of the
    GPU's NUMA node that the launcher may use.

    Args:
        numa_node_text: the GPU's ``/sys/bus/pci/devices/<bus id>/numa_node`` (``-1``: the
            machine reports no NUMA node for it, read as node 0).
        node_cpulists: node -> its ``/sys/devices/system/node/node<N>/cpulist``.
        allowed: the launcher's own CPU affinity.

    Returns:
        The node, and the CPUs.
    """
    node = max(int(numa_node_text.strip()), 0)
    return node, parse_cpu_list(node_cpulists.get(node, "")) & set(allowed)


def format_cpus(cpus: Iterable[int]) -> str:
    """A set of CPUs as a sysfs CPU list (``{0, 1, 2, 5}`` -> ``0-2,5``)."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive CPUs
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def smi_absence(nvidia_smi: str | None, returncode: int, output: str) -> str | None:
    """Why nvidia-smi shows no GPU here, or None when it lists at least one.

    Args:
        nvidia_smi: its path (None: not found on PATH).
        returncode: its exit status for the ``--query-gpu`` query.
        output: what it printed (stdout and stderr).
    """
    if nvidia_smi is None:
        return "nvidia-smi not found"
    if returncode != 0:
        first = next((line.strip() for line in output.splitlines() if line.strip()), "")
        return f"nvidia-smi failed (exit {returncode}{': ' + first if first else ''})"
    try:
        gpus = parse_gpus(output)
    except ValueError:
        return "nvidia-smi lists no GPU"
    return None if gpus else "nvidia-smi lists no GPU"


def torch_absence(available: bool, count: int, version: str, error: str = "") -> str | None:
    """Why torch sees no CUDA device, or None when it does.

    Args:
        available: ``torch.cuda.is_available()``.
        count: ``torch.cuda.device_count()``.
        version: ``torch.__version__``.
        error: why torch could not be asked at all ("" when it answered).
    """
    if error:
        return f"torch could not be asked ({error})"
    if available and count > 0:
        return None
    hint = " (a CPU build: set up with ELASTIC_RUN_TORCH=system, see README 'GPU check')"
    return f"torch.cuda.is_available() is False with torch {version}" + (
        hint if "+cpu" in version else ""
    )


def no_gpu_line(reason: str) -> str:
    """The one line printed on a machine without a GPU."""
    return f"gpu_check: no GPU on this machine ({reason}); nothing to check"


def parse_only(text: str | None, known: Iterable[int] = CHECKS) -> list[int]:
    """``--only 1,3`` -> [1, 3]; None -> every check, in order.

    Raises:
        ValueError: a part that is not a known check number.
    """
    numbers = sorted(known)
    if text is None:
        return numbers
    chosen: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdecimal() or int(part) not in numbers:
            raise ValueError(
                f"--only {text!r}: {part!r} is not a check number ({', '.join(map(str, numbers))})"
            )
        chosen.add(int(part))
    return sorted(chosen)


def env_differences(
    ours: Mapping[str, str],
    theirs: Mapping[str, str],
    *,
    ignore_keys: Iterable[str] = IGNORED_ENV_KEYS,
    ignore_prefixes: Sequence[str] = IGNORED_ENV_PREFIXES,
) -> list[str]:
    """How elastic-run's worker environment differs from torchrun's, variable by variable.

    Every variable counts (both launchers start from the same environment), except the ones
    that differ by nature (``ignore_keys``) and elastic-run's documented extras
    (``ignore_prefixes``).

    Returns:
        One sentence per difference, sorted by variable name; empty when they match.
    """
    skip = set(ignore_keys)
    prefixes = tuple(ignore_prefixes)
    out = []
    for key in sorted(set(ours) | set(theirs)):
        if key in skip or key.startswith(prefixes):
            continue
        a, b = ours.get(key), theirs.get(key)
        if a == b:
            continue
        if b is None:
            out.append(f"{key}={a!r} only under elastic-run")
        elif a is None:
            out.append(f"{key}={b!r} only under torchrun")
        else:
            out.append(f"{key}: elastic-run {a!r}, torchrun {b!r}")
    return out


def virtual_device(parent_visible: str | None, local_rank: int) -> str:
    """The CUDA_VISIBLE_DEVICES a worker gets under ``--virtual-local-rank`` (torchrun's rule:
    the ``local_rank``-th entry of the launcher's own list, or the index itself without one)."""
    if parent_visible is None:
        return str(local_rank)
    entries = [e.strip() for e in parent_visible.split(",")]
    return entries[local_rank]


def parse_records(text: str) -> list[dict[str, Any]]:
    """The workers' JSON-lines records; a last line still being written is left out."""
    records = []
    for line in text.split("\n")[:-1]:  # the part after the last newline is not complete
        line = line.strip()
        if line:
            records.append(json.loads(line))
    return records


def first_step_after(
    records: Iterable[Mapping[str, Any]],
    t: float,
    *,
    excluded_pids: Iterable[int] = (),
    world: int | None = None,
) -> Mapping[str, Any] | None:
    """The earliest ``step`` record stamped after ``t``, by a pid not in ``excluded_pids`` (and
    at world size ``world`` when given): the moment training ran again."""
    excluded = set(excluded_pids)
    found = [
        r
        for r in records
        if r.get("kind") == "step"
        and float(r["t"]) > t
        and int(r["pid"]) not in excluded
        and (world is None or int(r["world"]) == world)
    ]
    return min(found, key=lambda r: float(r["t"])) if found else None


def verdict_line(result: Result) -> str:
    """The one line said as soon as a check ends."""
    parts = [f"check {result.check} ({result.name}): {result.verdict}"]
    if result.figure:
        parts.append(result.figure)
    if result.detail:
        parts.append(result.detail)
    return " - ".join(parts)


def render_table(results: Sequence[Result]) -> str:
    """The results as a plain text table: check, verdict, figure, detail."""
    header = ("check", "verdict", "figure", "detail")
    rows = [(f"{r.check} {r.name}", r.verdict, r.figure, r.detail) for r in results]
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(3)]

    def line(cells: Sequence[str]) -> str:
        fixed = "  ".join(cell.ljust(width) for cell, width in zip(cells[:3], widths, strict=True))
        return f"{fixed}  {cells[3]}".rstrip()

    ruler = "  ".join("-" * w for w in widths) + "  ------"
    return "\n".join([line(header), ruler, *(line(row) for row in rows)])


def results_document(results: Sequence[Result], facts: Mapping[str, Any]) -> dict[str, Any]:
    """What ``--json PATH`` writes: the machine's facts and every row."""
    return {
        "v": 1,
        "facts": dict(facts),
        "results": [asdict(r) for r in results],
        "failed": sum(r.verdict == "FAIL" for r in results),
    }


def verdict_of(problems: Sequence[str], skips: Sequence[str]) -> str:
    """FAIL when anything went wrong; else SKIP when the machine kept something from being
    checked (a sandbox's refusal); else PASS."""
    if problems:
        return "FAIL"
    return "SKIP" if skips else "PASS"


# What py-spy (through elastic-run's stacks file, "no stacks: <why>") says when the machine, not
# the product, forbids reading another process's memory: no permission to ptrace, or a sandbox
# (gVisor) that does not implement process_vm_readv.
_SANDBOX_WORDS = (
    "ptrace",
    "permission denied",
    "operation not permitted",
    "not implemented",
    "not supported",
    "function not implemented",
)


def sandbox_refusal(stacks_text: str) -> str | None:
    """Why the stacks could not be taken, when the machine forbade it (None: it did not, or the
    stacks were taken)."""
    for line in stacks_text.splitlines():
        if line.startswith("no stacks:"):
            why = line.removeprefix("no stacks:").strip()
            if any(word in why.lower() for word in _SANDBOX_WORDS):
                return why
    return None


def requirements_of(text: str) -> dict[str, str]:
    """Project name (lower case, ``_`` as ``-``) -> its version specifier, from requirement
    lines (``click>=8.1``; comments and blank lines skipped)."""
    found = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cut = next((i for i, c in enumerate(line) if c in "<>=!~ ;["), len(line))
        found[line[:cut].strip().lower().replace("_", "-")] = line[cut:].strip()
    return found


def exit_code(results: Sequence[Result]) -> int:
    """1 when any check failed, else 0."""
    return 1 if any(r.verdict == "FAIL" for r in results) else 0
