"""--numa-binding's plan (torch 2.13's four modes) on made-up /sys trees and on this machine's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastic_run.agent.workers.numa import (
    Topology,
    cpus_for_gpu,
    format_ranges,
    parse_ranges,
    read_topology,
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_sys(root: Path) -> list[str]:
    """2 sockets x 2 NUMA nodes x 4 cores x 2 threads (CPU c and c+32 are siblings); one L3
    per pair of cores; GPUs 0,1 on node 0, GPU 2 on node 1, GPU 3 on node 3. Returns PCI ids."""
    for node in range(4):
        cores = range(node * 4, node * 4 + 4)
        cpus = [*cores, *(c + 32 for c in cores)]
        _write(root / f"devices/system/node/node{node}/cpulist", format_ranges(cpus))
        for core in cores:
            for cpu in (core, core + 32):
                d = root / f"devices/system/cpu/cpu{cpu}"
                _write(d / "topology/physical_package_id", str(node // 2))
                _write(d / "topology/thread_siblings_list", f"{core},{core + 32}")
                first = core - core % 2
                shared = f"{first}-{first + 1},{first + 32}-{first + 33}"
                for index, (kind, level, cpus_shared) in enumerate(
                    [("Data", 1, f"{core},{core + 32}"), ("Instruction", 1, f"{core},{core + 32}"),
                     ("Unified", 2, f"{core},{core + 32}"), ("Unified", 3, shared)]
                ):  # fmt: skip
                    _write(d / f"cache/index{index}/type", kind)
                    _write(d / f"cache/index{index}/level", str(level))
                    _write(d / f"cache/index{index}/shared_cpu_list", cpus_shared)
    pci = ["0000:0a:00.0", "0000:0b:00.0", "0000:8a:00.0", "0000:cb:00.0"]
    for addr, node in zip(pci, (0, 0, 1, 3), strict=True):
        _write(root / "bus/pci/devices" / addr / "numa_node", str(node))
    return pci


@pytest.fixture
def topo(tmp_path: Path) -> Topology:
    pci = fake_sys(tmp_path)
    return read_topology(pci, tmp_path, allowed=range(64))


def test_ranges_round_trip() -> None:
    assert parse_ranges("0-2,4,6-7\n") == {0, 1, 2, 4, 6, 7}
    assert format_ranges({7, 6, 4, 2, 1, 0}) == "0-2,4,6-7"
    assert format_ranges([]) == ""


def test_node_mode_binds_to_the_gpus_numa_node(topo: Topology) -> None:
    assert format_ranges(cpus_for_gpu(topo, "node", 0)) == "0-3,32-35"
    assert format_ranges(cpus_for_gpu(topo, "node", 2)) == "4-7,36-39"


def test_socket_mode_binds_to_every_node_of_the_socket(topo: Topology) -> None:
    assert format_ranges(cpus_for_gpu(topo, "socket", 2)) == "0-7,32-39"
    assert format_ranges(cpus_for_gpu(topo, "socket", 3)) == "8-15,40-47"


def test_exclusive_mode_splits_physical_cores_among_the_nodes_gpus(topo: Topology) -> None:
    assert format_ranges(cpus_for_gpu(topo, "exclusive", 0)) == "0-1,32-33"
    assert format_ranges(cpus_for_gpu(topo, "exclusive", 1)) == "2-3,34-35"
    assert format_ranges(cpus_for_gpu(topo, "exclusive", 2)) == "4-7,36-39"


def test_exclusive_gives_the_lowest_gpus_the_extra_core(tmp_path: Path) -> None:
    pci = fake_sys(tmp_path)
    topo = read_topology(pci, tmp_path, allowed=[0, 1, 2, 32, 33, 34])  # 3 cores for 2 GPUs
    assert format_ranges(cpus_for_gpu(topo, "exclusive", 0)) == "0-1,32-33"
    assert format_ranges(cpus_for_gpu(topo, "exclusive", 1)) == "2,34"


def test_core_complex_mode_gives_each_gpu_its_own_last_level_cache(topo: Topology) -> None:
    assert format_ranges(cpus_for_gpu(topo, "core-complex", 0)) == "0-1,32-33"
    assert format_ranges(cpus_for_gpu(topo, "core-complex", 1)) == "2-3,34-35"
    assert format_ranges(cpus_for_gpu(topo, "core-complex", 2)) == "4-5,36-37"


def test_affinity_limits_the_plan_and_bad_requests_fail(tmp_path: Path) -> None:
    pci = fake_sys(tmp_path)
    topo = read_topology(pci, tmp_path, allowed=[1, 2])
    assert cpus_for_gpu(topo, "node", 0) == {1, 2}
    with pytest.raises(ValueError, match="no allowed CPU"):
        cpus_for_gpu(topo, "node", 2)
    with pytest.raises(ValueError, match="there is no GPU 9"):
        cpus_for_gpu(topo, "node", 9)
    with pytest.raises(ValueError, match="unknown NUMA binding mode"):
        cpus_for_gpu(topo, "rack", 0)


def test_this_machines_sys_reads() -> None:
    if not Path("/sys/devices/system/node").is_dir():
        # A kernel that shows no NUMA nodes (no set-up adds them): the plan cannot be read,
        # and says so as its docstring promises.
        with pytest.raises(OSError):
            read_topology([], Path("/sys"))
        return
    topo = read_topology([], Path("/sys"))
    assert topo.allowed == frozenset(os.sched_getaffinity(0))
    assert set().union(*topo.node_cpus.values()) >= topo.allowed
