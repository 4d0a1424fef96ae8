"""SLURM awareness: turn an allocation's environment into launcher defaults.

One concept: read what Slurm tells a job step (``SLURM_*`` variables, passed in as a
Mapping, never read from ``os.environ`` here) and derive the torchrun-style options a
user would otherwise compute by hand, each with the reason it was chosen.

Invariants:
- An option the user gave explicitly always wins; a default only fills a gap.
- Outside an allocation (no ``SLURM_JOB_ID``) nothing is derived.
- Everything here is a pure function of its arguments, except :func:`rdzv_from_slurm_job`,
  which asks ``scontrol``/``squeue`` on a login node.

Choices worth knowing:
- ``rdzv_id`` is ``<SLURM_JOB_ID>-<SLURM_STEP_ID>`` inside a job step, so that two
  ``srun elastic-run`` steps of one job (one after another, or side by side) never share a
  rendezvous: with etcd a closed rendezvous of step 0 would otherwise stop step 1 at once.
  From a login node, ``elastic-run status --slurm-job JOBID`` finds the step itself
  (:func:`rdzv_from_slurm_job` asks ``squeue`` for the job's running steps), and
  ``JOBID.STEP`` names one explicitly, as Slurm's own tools do.
- ``nproc_per_node`` comes from ``SLURM_GPUS_ON_NODE`` only. ``SLURM_NTASKS_PER_NODE``
  counts Slurm tasks, that is agents, which is 1 in the one-agent-per-node model, and
  ``SLURM_CPUS_ON_NODE`` counts cores, a poor number of CPU training processes (each uses
  threads); without GPUs, torchrun's default (1) stands and the user says more.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elastic_run.cli.slurm.hostlist import expand_hostlist, first_host
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import parse_node_count

__all__ = [
    "C10D_DEFAULT_PORT",
    "EMBEDDED_ETCD_MEMBERS",
    "ETCD_DEFAULT_PORT",
    "SlurmDefault",
    "format_print_config",
    "node_count",
    "parse_scontrol_nodelist",
    "rdzv_from_slurm_job",
    "rdzv_id_for",
    "should_exit_as_extra_task",
    "slurm_defaults",
]

C10D_DEFAULT_PORT = 29400
ETCD_DEFAULT_PORT = 2379

_ENDPOINT_PORTS: dict[str, int] = {
    "c10d": C10D_DEFAULT_PORT,
    "etcd": ETCD_DEFAULT_PORT,
    "etcd-v2": ETCD_DEFAULT_PORT,
}

# How many hosts of an allocation run the members of an embedded etcd cluster (the first ones).
EMBEDDED_ETCD_MEMBERS = 3

# Slurm's step ids at and above this are its own pseudo steps (batch, extern, interactive),
# never an `srun` the user started.
_FIRST_PSEUDO_STEP_ID = 0xFFFFFFF0
_PSEUDO_STEP_NAMES = frozenset({"batch", "extern", "interactive"})


@dataclass(frozen=True)
class SlurmDefault:
    """One launcher option derived from the Slurm environment.

    Attributes:
        name: the option's name, spelled as the launcher's parameter (``nnodes``).
        value: the option's value, as the user would have typed it.
        reason: where it came from, e.g. ``from SLURM_JOB_NODELIST=127.0.0.[1-2]``.
        notice: a line to print before the job starts, or ``""``.
    """

    name: str
    value: str
    reason: str
    notice: str = ""


def _is_number(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes ``²``, which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _nodelist(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """Return (variable name, value) of the job's node list, if Slurm set one."""
    for variable in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None


def node_count(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Return (variable name, count) of the allocation's nodes, if Slurm set it.

    Args:
        environ: the process environment.

    Returns:
        ``("SLURM_JOB_NUM_NODES", 4)`` or the same from ``SLURM_NNODES``; None if neither.

    Raises:
        ConfigurationError: the variable is not a node count (``settings.parse_node_count``:
            a whole number in 1..MAX_NODES, as ``--nnodes``).
    """
    for variable in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = environ.get(variable, "").strip()
        if value:
            return variable, parse_node_count(value, variable)
    return None


def _step_id(environ: Mapping[str, str]) -> str | None:
    """Return the job step id of a real `srun` step, or None (batch script, pseudo step)."""
    value = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID", "")).strip()
    if not value or value in _PSEUDO_STEP_NAMES:
        return None
    if _is_number(value) and int(value) >= _FIRST_PSEUDO_STEP_ID:
        return None
    return value


def rdzv_id_for(job_id: str, step_id: str | None) -> str:
    """Return the rendezvous id of a Slurm job step: ``JOB-STEP``, or ``JOB`` without a step.

    Args:
        job_id: ``SLURM_JOB_ID``.
        step_id: ``SLURM_STEP_ID``, or None outside a step.

    Returns:
        The run id the agents of that step share.
    """
    return job_id if step_id is None else f"{job_id}-{step_id}"


def _parse_min_only(text: str) -> int | None:
    """Return MIN for a ``MIN:`` nnodes value (empty MAX), else None.

    MIN is read by the rendezvous's one node-count parser (``settings.parse_node_count``); the
    whole ``MIN:MAX`` it completes is checked again by ``parse_nnodes`` at the CLI's edge.
    """
    if not text.endswith(":") or text.count(":") != 1:
        return None
    return parse_node_count(text[:-1], f"--nnodes {text!r}: MIN")


def _nnodes_default(
    environ: Mapping[str, str], given: Mapping[str, object], elastic_min: int | None
) -> SlurmDefault | None:
    """Derive ``nnodes``: the node count, ``MIN:count`` when elastic, or complete ``MIN:``."""
    given_value = given.get("nnodes")
    given_min = _parse_min_only(str(given_value)) if given_value is not None else None
    if given_value is not None and given_min is None:
        return None  # the user gave a full value
    count = node_count(environ)
    if count is None:
        if given_min is not None:
            raise ConfigurationError(
                f"--nnodes {given_value}: an empty MAX is taken from the allocation, "
                "but neither SLURM_JOB_NUM_NODES nor SLURM_NNODES is set"
            )
        return None
    variable, nodes = count
    minimum = given_min if given_min is not None else elastic_min
    if minimum is None:
        return SlurmDefault("nnodes", str(nodes), f"from {variable}={nodes}")
    if minimum > nodes:
        raise ConfigurationError(
            f"--nnodes MIN={minimum} is more than the {nodes} nodes of the allocation "
            f"({variable}={nodes})"
        )
    source = f"--nnodes {given_value}" if given_min is not None else "the elastic minimum"
    return SlurmDefault(
        "nnodes", f"{minimum}:{nodes}", f"MIN from {source}, MAX from {variable}={nodes}"
    )


def slurm_defaults(
    environ: Mapping[str, str],
    *,
    given: Mapping[str, object],
    elastic_min: int | None,
) -> list[SlurmDefault]:
    """Derive the launcher options a Slurm allocation implies, for the gaps the user left.

    Inside an allocation (``SLURM_JOB_ID`` set), fills only what ``given`` lacks:
    ``rdzv_id`` (``JOB-STEP``, see the module docstring), ``nnodes`` (the node count, or
    ``MIN:count`` when ``elastic_min`` is given or the user passed ``--nnodes MIN:``),
    ``rdzv_backend`` (c10d), ``rdzv_endpoint`` (first host of the node list, port 29400
    for c10d or 2379 for etcd; the first three hosts for embedded-etcd, one when there are
    fewer than three; none for static) and ``nproc_per_node`` (from
    ``SLURM_GPUS_ON_NODE`` when positive).

    Args:
        environ: the process environment (``os.environ`` at the CLI edge).
        given: the options the user set explicitly, by name (rdzv_id, nnodes,
            rdzv_backend, rdzv_endpoint, nproc_per_node); a ``nnodes`` of ``"MIN:"``
            asks for MAX from the allocation.
        elastic_min: the minimum number of nodes for an elastic job, or None for a fixed
            size.

    Returns:
        The derived options, each with its reason; empty outside an allocation.

    Raises:
        ConfigurationError: a Slurm variable is malformed, ``MIN`` exceeds the node count,
            or ``--nnodes MIN:`` is used outside an allocation.
    """
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        given_nnodes = given.get("nnodes")
        if given_nnodes is not None and _parse_min_only(str(given_nnodes)) is not None:
            raise ConfigurationError(
                f"--nnodes {given_nnodes}: an empty MAX needs a Slurm allocation "
                "(SLURM_JOB_ID is not set); give --nnodes MIN:MAX"
            )
        return []

    chosen: list[SlurmDefault] = []
    if "rdzv_id" not in given:
        step_id = _step_id(environ)
        reason = f"from SLURM_JOB_ID={job_id}"
        if step_id is not None:
            reason += f" and SLURM_STEP_ID={step_id}"
        chosen.append(SlurmDefault("rdzv_id", rdzv_id_for(job_id, step_id), reason))

    nnodes = _nnodes_default(environ, given, elastic_min)
    if nnodes is not None:
        chosen.append(nnodes)

    backend = given.get("rdzv_backend")
    if backend is None:
        backend = "c10d"
        chosen.append(SlurmDefault("rdzv_backend", "c10d", "inside a Slurm allocation"))

    port = _ENDPOINT_PORTS.get(str(backend))
    nodelist = _nodelist(environ)
    if "rdzv_endpoint" not in given and backend == "embedded-etcd" and nodelist is not None:
        chosen.append(_embedded_members(*nodelist))
    elif "rdzv_endpoint" not in given and port is not None and nodelist is not None:
        variable, value = nodelist
        chosen.append(
            SlurmDefault(
                "rdzv_endpoint",
                f"{first_host(value)}:{port}",
                f"first host of {variable}={value}, port {port} for {backend}",
            )
        )

    gpus = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if "nproc_per_node" not in given and _is_number(gpus) and int(gpus) > 0:
        chosen.append(
            SlurmDefault("nproc_per_node", str(int(gpus)), f"from SLURM_GPUS_ON_NODE={gpus}")
        )
    return chosen


def _embedded_members(variable: str, nodelist: str) -> SlurmDefault:
    """The members of an embedded etcd cluster: the allocation's first three hosts (or one)."""
    hosts = expand_hostlist(nodelist)
    if len(hosts) >= EMBEDDED_ETCD_MEMBERS:
        members = hosts[:EMBEDDED_ETCD_MEMBERS]
        return SlurmDefault(
            "rdzv_endpoint",
            ",".join(members),
            f"the first {EMBEDDED_ETCD_MEMBERS} hosts of {variable}={nodelist} run the embedded "
            "etcd members",
        )
    notice = ""
    if len(hosts) == 2:
        notice = (
            f"the allocation has 2 nodes: the embedded etcd cluster has one member, on "
            f"{hosts[0]} (a two-member cluster survives nothing)"
        )
    return SlurmDefault(
        "rdzv_endpoint",
        hosts[0],
        f"the first host of {variable}={nodelist} runs the one embedded etcd member",
        notice,
    )


def should_exit_as_extra_task(environ: Mapping[str, str]) -> str | None:
    """Tell a surplus Slurm task to leave: one agent per node runs on SLURM_LOCALID 0.

    ``srun --ntasks-per-node=K elastic-run ...`` starts K copies per node; only the one with
    local id 0 runs the agent (which starts the node's workers itself).

    Args:
        environ: the process environment.

    Returns:
        A one-line notice for the CLI to print before it exits 0, or None for the task
        that should run the agent (or outside Slurm).
    """
    local_id = environ.get("SLURM_LOCALID", "").strip()
    if not local_id or local_id == "0":
        return None
    node = environ.get("SLURMD_NODENAME", "").strip() or "?"
    return (
        f"elastic-run: SLURM task with SLURM_LOCALID={local_id} on node {node} exits: "
        "one agent per node runs on SLURM_LOCALID 0"
    )


def parse_scontrol_nodelist(text: str) -> str:
    """Return the ``NodeList=`` value of ``scontrol show job`` output.

    Args:
        text: the output of ``scontrol show job JOBID``.

    Returns:
        The node list expression, e.g. ``127.0.0.[1-2]``.

    Raises:
        ConfigurationError: the job has no node list yet (pending) or the text has none.
    """
    match = re.search(r"(?:^|\s)NodeList=(\S+)", text)
    if match is None or match.group(1) in ("(null)", ""):
        raise ConfigurationError("scontrol shows no NodeList for the job (is it still pending?)")
    return match.group(1)


def _run_slurm_tool(argv: list[str], timeout_s: float) -> str:
    """Run a Slurm client command and return its stdout, as a ConfigurationError on failure."""
    try:
        completed = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"{' '.join(argv)} failed: {exc}") from exc
    if completed.returncode != 0:
        detail = completed.stderr.strip() or f"exit code {completed.returncode}"
        raise ConfigurationError(f"{' '.join(argv)} failed: {detail}")
    return completed.stdout


def _user_steps(job_id: str, squeue_output: str) -> list[str]:
    """Return the user step ids of ``job_id`` from ``squeue -h -s -o %i`` output."""
    steps: list[str] = []
    for line in squeue_output.split():
        job, _, step = line.partition(".")
        if job != job_id or not step or step in _PSEUDO_STEP_NAMES:
            continue
        if _is_number(step) and int(step) >= _FIRST_PSEUDO_STEP_ID:
            continue
        steps.append(step)
    return steps


def rdzv_from_slurm_job(job_id: str, *, timeout_s: float = 10.0) -> tuple[str, str]:
    """Find the rendezvous id and c10d endpoint of a Slurm job, from a login node.

    Uses ``scontrol show job`` for the node list (the endpoint is its first host, port
    29400) and ``squeue -s`` for the running ``srun`` step (the rendezvous id is
    ``JOB-STEP``, as :func:`slurm_defaults` makes it inside the job).

    Args:
        job_id: ``JOBID``, or ``JOBID.STEP`` to name the step.
        timeout_s: how long each Slurm command may take.

    Returns:
        ``(rdzv_id, endpoint)``, e.g. ``("1234-0", "127.0.0.1:29400")``; the id is just the
        job id when the job has no running step.

    Raises:
        ConfigurationError: scontrol is not on PATH, the job is unknown or pending, or it
            runs several steps and ``JOBID.STEP`` must say which.
    """
    job, _, step = job_id.strip().partition(".")
    if not _is_number(job) or (step and not _is_number(step)):
        raise ConfigurationError(f"--slurm-job {job_id!r}: expected JOBID or JOBID.STEP")
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise ConfigurationError(
            f"--slurm-job {job_id}: scontrol is not on PATH; give --rdzv-endpoint and --rdzv-id"
        )
    text = _run_slurm_tool([scontrol, "show", "job", job], timeout_s)
    endpoint = f"{first_host(parse_scontrol_nodelist(text))}:{C10D_DEFAULT_PORT}"
    if step:
        return rdzv_id_for(job, step), endpoint
    squeue = shutil.which("squeue")
    if squeue is None:
        return job, endpoint
    steps = _user_steps(
        job, _run_slurm_tool([squeue, "-h", "-s", "-j", job, "-o", "%i"], timeout_s)
    )
    if len(steps) > 1:
        raise ConfigurationError(
            f"Slurm job {job} runs {len(steps)} steps ({', '.join(steps)}); "
            f"name one as --slurm-job {job}.STEP"
        )
    return rdzv_id_for(job, steps[0] if steps else None), endpoint


def format_print_config(chosen: Iterable[SlurmDefault | tuple[str, object, str]]) -> str:
    """Render the effective options and why each was chosen, for ``--print-config``.

    Args:
        chosen: (name, value, reason) triples or :class:`SlurmDefault` items, in order.

    Returns:
        One line per option, aligned: ``nnodes         = 2:4  (MIN from ..., MAX from ...)``,
        ending in a newline; a single line saying so when there is nothing.
    """
    rows: list[tuple[str, str, str]] = []
    for item in chosen:
        if isinstance(item, SlurmDefault):
            rows.append((item.name, item.value, item.reason))
        else:
            name, value, reason = item
            rows.append((name, str(value), reason))
    if not rows:
        return "elastic-run configuration: nothing derived\n"
    name_width = max(len(name) for name, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines = ["elastic-run configuration:"]
    for name, value, reason in rows:
        line = f"  {name.ljust(name_width)} = {value.ljust(value_width)}"
        lines.append(f"{line}  ({reason})" if reason else line.rstrip())
    return "\n".join(lines) + "\n"
