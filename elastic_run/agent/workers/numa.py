"""NUMA binding of workers (torchrun's ``--numa-binding``): which CPUs each worker may run on.

One concept: from the machine's topology under ``/sys`` and the NUMA node of each GPU, the CPU
set of the worker whose local rank is ``gpu_index``, by torch 2.13's four modes:

- ``node``: every allowed CPU of the GPU's NUMA node;
- ``socket``: every allowed CPU of every NUMA node on the GPU's socket;
- ``exclusive``: the GPU's NUMA node's physical cores split evenly among that node's GPUs in
  index order (the lowest GPUs get one extra core when it does not divide), each with all its
  hardware threads;
- ``core-complex``: one last-level-cache group of the GPU's NUMA node per GPU (largest groups
  first, then lowest CPU), round-robin over the node's GPUs.

"Allowed" is this process's affinity (``sched_getaffinity``). The worker command is wrapped as
torch wraps it: ``numactl --physcpubind=<ranges> <command>``. The plan is a pure function of a
:class:`Topology`; :func:`read_topology` fills one from a ``/sys`` tree (tests pass a made-up
one), and the GPUs' NUMA nodes come from their PCI addresses.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from elastic_run.errors import AgentError, ConfigurationError

__all__ = [
    "NUMA_MODES",
    "Topology",
    "check_numa_binding",
    "cpus_for_gpu",
    "format_ranges",
    "numa_wrapped",
    "parse_ranges",
    "read_topology",
]

NUMA_MODES = ("node", "socket", "exclusive", "core-complex")


@dataclass(frozen=True)
class Topology:
    """What the plan needs to know of a machine.

    Attributes:
        node_cpus: the CPUs of each NUMA node.
        cpu_socket: the socket (physical package) of each CPU.
        cpu_core: the physical core of each CPU (the lowest of its thread siblings).
        cpu_cache: the last-level cache group of each CPU (the lowest CPU sharing it).
        gpu_nodes: the NUMA node of each GPU, by index.
        allowed: the CPUs this process may run on.
    """

    node_cpus: dict[int, frozenset[int]]
    cpu_socket: dict[int, int]
    cpu_core: dict[int, int]
    cpu_cache: dict[int, int]
    gpu_nodes: tuple[int, ...]
    allowed: frozenset[int]


def parse_ranges(text: str) -> set[int]:
    """``"0-2,4"`` (a sysfs CPU list) -> ``{0, 1, 2, 4}``."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def format_ranges(ints: Iterable[int]) -> str:
    """``{0, 1, 2, 4}`` -> ``"0-2,4"``."""
    items = sorted(set(ints))
    parts: list[str] = []
    start = prev = -2
    for n in items:
        if n == prev + 1:
            prev = n
            continue
        if start >= 0:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = n
    if start >= 0:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def _node_allowed(topo: Topology, node: int) -> set[int]:
    return set(topo.node_cpus.get(node, frozenset())) & topo.allowed


def _group(cpus: Iterable[int], key: dict[int, int]) -> dict[int, set[int]]:
    groups: dict[int, set[int]] = {}
    for cpu in cpus:
        groups.setdefault(key.get(cpu, cpu), set()).add(cpu)
    return groups


def cpus_for_gpu(topo: Topology, mode: str, gpu_index: int) -> set[int]:
    """The CPUs the worker of ``gpu_index`` is bound to under ``mode``.

    Raises:
        ValueError: an unknown mode or GPU, or no CPU to bind to.
    """
    if not 0 <= gpu_index < len(topo.gpu_nodes):
        raise ValueError(f"there is no GPU {gpu_index} (found {len(topo.gpu_nodes)})")
    node = topo.gpu_nodes[gpu_index]
    peers = sorted(i for i, n in enumerate(topo.gpu_nodes) if n == node)
    position = peers.index(gpu_index)
    cpus: set[int]
    if mode == "node":
        cpus = _node_allowed(topo, node)
    elif mode == "socket":
        own = _node_allowed(topo, node)
        socket = topo.cpu_socket.get(min(own)) if own else None
        cpus = set()
        for other in topo.node_cpus:
            allowed = _node_allowed(topo, other)
            if allowed and topo.cpu_socket.get(min(allowed)) == socket:
                cpus |= allowed
    elif mode == "exclusive":
        cores = sorted(_group(_node_allowed(topo, node), topo.cpu_core).items())
        per_gpu, extra = divmod(len(cores), len(peers))
        if per_gpu < 1:
            raise ValueError(
                f"NUMA node {node} has {len(cores)} physical cores for {len(peers)} GPUs"
            )
        start = position * per_gpu + min(position, extra)
        end = start + per_gpu + (1 if position < extra else 0)
        cpus = {cpu for _, group in cores[start:end] for cpu in group}
    elif mode == "core-complex":
        caches = sorted(
            _group(_node_allowed(topo, node), topo.cpu_cache).items(),
            key=lambda item: (-len(item[1]), item[0]),
        )
        cpus = set(caches[position % len(caches)][1]) if caches else set()
    else:
        raise ValueError(f"unknown NUMA binding mode {mode!r} (known: {', '.join(NUMA_MODES)})")
    if not cpus:
        raise ValueError(f"no allowed CPU to bind GPU {gpu_index} to (NUMA node {node})")
    return cpus


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii").strip()


def _last_level_cache(cpu_dir: Path) -> set[int]:
    best, shared = -1, set[int]()
    cache_dir = cpu_dir / "cache"
    if not cache_dir.is_dir():
        return shared
    for entry in sorted(cache_dir.iterdir()):
        if not entry.name.startswith("index") or not entry.name[5:].isdecimal():
            continue
        if _read(entry / "type") not in ("Unified", "Data"):
            continue
        level = int(_read(entry / "level"))
        if level > best:
            best, shared = level, parse_ranges(_read(entry / "shared_cpu_list"))
    return shared


def read_topology(
    gpu_pci_addresses: Iterable[str],
    sys_root: Path = Path("/sys"),
    allowed: Iterable[int] | None = None,
) -> Topology:
    """Read the topology from ``sys_root`` for GPUs at these PCI addresses (``0000:dc:00.0``).

    Raises:
        OSError: a file the plan needs cannot be read.
    """
    node_root = sys_root / "devices/system/node"
    node_cpus = {
        int(d.name[4:]): frozenset(parse_ranges(_read(d / "cpulist")))
        for d in node_root.iterdir()
        if d.name.startswith("node") and d.name[4:].isdecimal()
    }
    every = set().union(*node_cpus.values()) if node_cpus else set()
    cpu_root = sys_root / "devices/system/cpu"
    socket, core, cache = {}, {}, {}
    for cpu in sorted(every):
        cpu_dir = cpu_root / f"cpu{cpu}"
        socket[cpu] = int(_read(cpu_dir / "topology/physical_package_id"))
        core[cpu] = min(parse_ranges(_read(cpu_dir / "topology/thread_siblings_list")))
        shared = _last_level_cache(cpu_dir)
        cache[cpu] = min(shared) if shared else cpu
    gpu_nodes = tuple(
        max(int(_read(sys_root / "bus/pci/devices" / addr / "numa_node")), 0)
        for addr in gpu_pci_addresses
    )
    mine = frozenset(allowed if allowed is not None else os.sched_getaffinity(0))
    return Topology(node_cpus, socket, core, cache, gpu_nodes, mine)


def _cuda_pci_addresses() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    addresses = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        domain, bus, device = (
            int(getattr(props, name)) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")
        )
        addresses.append(f"{domain:04x}:{bus:02x}:{device:02x}.0")
    return addresses


def check_numa_binding(mode: str | None) -> None:
    """Check before anything starts that ``--numa-binding`` can be applied on this machine.

    Raises:
        ConfigurationError: no numactl, or no CUDA device to bind next to.
    """
    if mode is None:
        return
    if shutil.which("numactl") is None:
        raise ConfigurationError(
            f"--numa-binding {mode} needs the numactl program (apt-get install numactl)"
        )
    if not _cuda_pci_addresses():
        raise ConfigurationError(f"--numa-binding {mode}: no CUDA device to bind the workers to")


_topology: Topology | None = None


def numa_wrapped(argv: tuple[str, ...], local_rank: int, mode: str | None) -> tuple[str, ...]:
    """The worker command, prefixed with ``numactl --physcpubind=...`` under ``mode``.

    Raises:
        AgentError: the plan cannot be made (a sysfs file missing, no CPU to bind to).
    """
    global _topology
    if mode is None:
        return argv
    try:
        if _topology is None:
            _topology = read_topology(_cuda_pci_addresses())
        cpus = cpus_for_gpu(_topology, mode, local_rank)
    except (OSError, ValueError) as exc:
        raise AgentError(f"--numa-binding {mode}: local rank {local_rank}: {exc}") from exc
    return ("numactl", f"--physcpubind={format_ranges(cpus)}", *argv)
