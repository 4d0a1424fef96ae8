"""The pure logic of scripts/gpu_check.py (scripts/gpu_check_logic.py): nvidia-smi's CSV, the
"no GPU" verdicts, the environment comparison with torchrun, the expected placements, the
workers' records, the table. No GPU, process or file is needed; the module is loaded from its
path, as the script loads it."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

LOGIC_PATH = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check_logic.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_logic", LOGIC_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


logic = _load()

H100_LINE = (
    "0, NVIDIA H100 80GB HBM3, 00000000:19:00.0, GPU-6f1c9f3e-aaaa-bbbb-cccc-0123456789ab, 0"
)


def test_the_logic_imports_nothing_of_the_outside_world() -> None:
    tree = ast.parse(LOGIC_PATH.read_text())
    names = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    names |= {
        (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    }
    assert names <= {"__future__", "json", "collections", "dataclasses", "typing"}


# --- nvidia-smi -------------------------------------------------------------------------------


def test_parse_gpus_reads_each_field() -> None:
    (gpu,) = logic.parse_gpus(H100_LINE + "\n")
    assert gpu == logic.Gpu(
        0,
        "NVIDIA H100 80GB HBM3",
        "00000000:19:00.0",
        "GPU-6f1c9f3e-aaaa-bbbb-cccc-0123456789ab",
        0,
    )


def test_parse_gpus_keeps_a_name_with_a_comma_and_unknown_memory() -> None:
    text = "0, A, B, 00000000:01:00.0, GPU-1, [N/A]\n1, C, 00000000:02:00.0, GPU-2, 512\n"
    first, second = logic.parse_gpus(text)
    assert (first.name, first.memory_used_mib) == ("A, B", None)
    assert (second.index, second.pci_bus_id, second.memory_used_mib) == (1, "00000000:02:00.0", 512)


def test_parse_gpus_of_nothing_is_no_gpu_and_a_short_line_is_an_error() -> None:
    assert logic.parse_gpus("\n") == []
    with pytest.raises(ValueError, match="fields"):
        logic.parse_gpus("0, NVIDIA H100\n")


def test_parse_compute_apps() -> None:
    text = "4242, 1024\n4343, [N/A]\n"
    assert logic.parse_compute_apps(text) == [
        logic.ComputeApp(4242, 1024),
        logic.ComputeApp(4343, None),
    ]
    assert logic.parse_compute_apps("") == []
    assert logic.parse_compute_apps("No running processes found\n") == []
    with pytest.raises(ValueError):
        logic.parse_compute_apps("4242\n")


def test_normalize_pci_bus_id_to_sysfs_form() -> None:
    assert logic.normalize_pci_bus_id("00000000:19:00.0") == "0000:19:00.0"
    assert logic.normalize_pci_bus_id("00000001:DC:00.0") == "0001:dc:00.0"
    assert logic.normalize_pci_bus_id("0000:19:00.0") == "0000:19:00.0"
    with pytest.raises(ValueError):
        logic.normalize_pci_bus_id("garbage")


# --- no GPU -----------------------------------------------------------------------------------


def test_smi_absence_says_why() -> None:
    assert logic.smi_absence(None, 0, "") == "nvidia-smi not found"
    assert logic.smi_absence("/usr/bin/nvidia-smi", 0, "") == "nvidia-smi lists no GPU"
    failed = logic.smi_absence(
        "/usr/bin/nvidia-smi",
        9,
        "\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    )
    assert failed == (
        "nvidia-smi failed (exit 9: NVIDIA-SMI has failed because it couldn't communicate "
        "with the NVIDIA driver.)"
    )
    assert logic.smi_absence("/usr/bin/nvidia-smi", 0, H100_LINE) is None


def test_torch_absence_says_why_and_hints_at_a_cpu_build() -> None:
    assert logic.torch_absence(True, 1, "2.11.0+cu130") is None
    cpu = logic.torch_absence(False, 0, "2.13.0+cpu")
    assert cpu is not None and "2.13.0+cpu" in cpu and "ELASTIC_RUN_TORCH=system" in cpu
    broken = logic.torch_absence(False, 0, "2.11.0+cu130")
    assert broken == "torch.cuda.is_available() is False with torch 2.11.0+cu130"
    assert logic.torch_absence(True, 0, "2.11.0+cu130") is not None
    assert "could not be asked" in str(logic.torch_absence(False, 0, "?", "TimeoutExpired"))


def test_no_gpu_line_is_one_line() -> None:
    line = logic.no_gpu_line("nvidia-smi not found")
    assert "\n" not in line and "no GPU" in line and "nvidia-smi not found" in line


# --- options ----------------------------------------------------------------------------------


def test_parse_only() -> None:
    assert logic.parse_only(None) == [1, 2, 3, 4, 5, 6, 7]
    assert logic.parse_only("3, 1,3") == [1, 3]
    for bad in ("8", "0", "a", "1,,2", ""):
        with pytest.raises(ValueError, match="not a check number"):
            logic.parse_only(bad)


# --- environments -----------------------------------------------------------------------------


def test_env_differences_of_the_same_environment_is_empty() -> None:
    env = {"RANK": "0", "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"}
    assert logic.env_differences(env, dict(env)) == []


def test_env_differences_ignores_what_differs_by_nature_and_our_extras() -> None:
    ours = {
        "RANK": "0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "a",
        "TORCHELASTIC_ERROR_FILE": "/tmp/a/error.json",
        "ELASTIC_RUN_GUARDIAN": "token",
    }
    theirs = {
        "RANK": "0",
        "MASTER_PORT": "41234",
        "TORCHELASTIC_RUN_ID": "b",
        "TORCHELASTIC_ERROR_FILE": "/tmp/b/error.json",
    }
    assert logic.env_differences(ours, theirs) == []


def test_env_differences_names_each_difference_in_order() -> None:
    ours = {"RANK": "0", "MASTER_ADDR": "127.0.0.1", "EXTRA": "x"}
    theirs = {"RANK": "0", "MASTER_ADDR": "localhost", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM"}
    assert logic.env_differences(ours, theirs) == [
        "EXTRA='x' only under elastic-run",
        "MASTER_ADDR: elastic-run '127.0.0.1', torchrun 'localhost'",
        "TORCHELASTIC_SIGNALS_TO_HANDLE='SIGTERM' only under torchrun",
    ]


def test_virtual_device() -> None:
    assert logic.virtual_device(None, 3) == "3"
    assert logic.virtual_device("4,5,6", 1) == "5"
    assert logic.virtual_device("GPU-a, GPU-b", 1) == "GPU-b"


# --- placement --------------------------------------------------------------------------------


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_cpu_lists_round_trip(cpus: set[int]) -> None:
    assert logic.parse_cpu_list(logic.format_cpus(cpus)) == cpus


def test_cpu_list_forms() -> None:
    assert logic.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert logic.format_cpus([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert logic.format_cpus([]) == ""


def test_numa_node_cpus_is_the_nodes_cpus_that_the_launcher_may_use() -> None:
    lists = {0: "0-7", 1: "8-15"}
    assert logic.numa_node_cpus("1\n", lists, range(4, 12)) == (1, {8, 9, 10, 11})
    # A machine that reports no node for the device: node 0.
    assert logic.numa_node_cpus("-1\n", lists, range(16)) == (0, set(range(8)))


# --- records ----------------------------------------------------------------------------------


def test_parse_records_leaves_out_a_line_being_written() -> None:
    text = '{"kind": "start", "pid": 1}\n{"kind": "step", "pid": 1}\n{"kind": "st'
    assert [r["kind"] for r in logic.parse_records(text)] == ["start", "step"]
    assert logic.parse_records("") == []


def _step(pid: int, t: float, world: int = 1) -> dict[str, object]:
    return {"kind": "step", "pid": pid, "t": t, "world": world, "step": 0}


def test_first_step_after_a_kill() -> None:
    records = [
        _step(10, 1.0, 2),
        _step(10, 2.5, 2),  # the killed worker's last step, stamped after the kill
        {"kind": "start", "pid": 11, "t": 2.6},
        _step(11, 3.5, 2),
        _step(11, 3.0, 1),
    ]
    found = logic.first_step_after(records, 2.0, excluded_pids=[10])
    assert found is not None and found["t"] == 3.0
    found = logic.first_step_after(records, 2.0, world=2)
    assert found is not None and (found["pid"], found["t"]) == (10, 2.5)
    assert logic.first_step_after(records, 4.0) is None


# --- verdicts and the table -------------------------------------------------------------------


def _results() -> list[object]:
    return [
        logic.Result("1", "nproc gpu", "PASS", "8 workers for 8 GPUs", "ok"),
        logic.Result("7b", "numa", "SKIP", "", "numactl is not installed"),
        logic.Result("3", "worker kill", "FAIL", "1.20 s", "the new worker started cold"),
    ]


def test_result_takes_only_the_three_verdicts() -> None:
    with pytest.raises(ValueError, match="verdict"):
        logic.Result("1", "x", "OK")


def test_verdict_line() -> None:
    line = logic.verdict_line(logic.Result("3", "worker kill", "PASS", "1.20 s", "warm"))
    assert line == "check 3 (worker kill): PASS - 1.20 s - warm"
    assert logic.verdict_line(logic.Result("7b", "numa", "SKIP")) == "check 7b (numa): SKIP"


def test_render_table_lines_up_every_row() -> None:
    lines = logic.render_table(_results()).splitlines()
    assert lines[0].split() == ["check", "verdict", "figure", "detail"]
    assert len(lines) == 5
    column = lines[0].index("verdict")
    assert [line[column : column + 4] for line in lines[2:]] == ["PASS", "SKIP", "FAIL"]
    assert lines[4].endswith("the new worker started cold")


def test_results_document_and_exit_code() -> None:
    results = _results()
    doc = logic.results_document(results, {"torch": "2.11.0+cu130"})
    assert doc["v"] == 1 and doc["failed"] == 1 and doc["facts"] == {"torch": "2.11.0+cu130"}
    assert doc["results"][1] == {
        "check": "7b",
        "name": "numa",
        "verdict": "SKIP",
        "figure": "",
        "detail": "numactl is not installed",
    }
    assert logic.exit_code(results) == 1
    assert logic.exit_code(results[:2]) == 0
    assert logic.exit_code([]) == 0


# --- the sandbox, the verdicts, the wheels --------------------------------------------------


def test_verdict_of_fails_on_a_problem_and_skips_only_without_one() -> None:
    assert logic.verdict_of([], []) == "PASS"
    assert logic.verdict_of([], ["ptrace forbidden"]) == "SKIP"
    assert logic.verdict_of(["no restart"], ["ptrace forbidden"]) == "FAIL"


@pytest.mark.parametrize(
    "why",
    [
        "no permission to read the worker's memory (ptrace): run the agent as the workers' user",
        "Permission denied (os error 13)",
        "Failed to copy memory: Function not implemented (os error 38)",
        "Operation not permitted (os error 1)",
    ],
)
def test_a_sandboxs_refusal_of_the_stacks_is_a_skip_reason(why: str) -> None:
    text = f"# stacks of rank 0 (local rank 0, pid 7): hung (taken 2026-12-01T00:00)\nno stacks: {why}\n"
    assert logic.sandbox_refusal(text) == why


def test_stacks_that_were_taken_or_failed_otherwise_are_no_refusal() -> None:
    assert (
        logic.sandbox_refusal("Thread 7 (idle)\n    stuck_in_cuda_sleep (gpu_worker.py:170)\n")
        is None
    )
    assert logic.sandbox_refusal("no stacks: py-spy did not answer in 10 s\n") is None
    assert logic.sandbox_refusal("") is None


def test_the_wheels_are_the_projects_dependencies_less_torch_and_the_slurm_only_one() -> None:
    """scripts/gpu_check_requirements.txt (what docs/gpu-check.md downloads) stays pyproject's."""
    import tomllib

    root = LOGIC_PATH.parents[1]
    declared = logic.requirements_of(
        "\n".join(tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"])
    )
    wheels = logic.requirements_of((root / "scripts" / "gpu_check_requirements.txt").read_text())
    expected = {k: v for k, v in declared.items() if k not in ("torch", "python-hostlist")}
    assert wheels == expected


def test_requirements_of_reads_names_and_specifiers() -> None:
    text = "# a comment\n\nClick>=8.1  # why\netcd_sdk_python==0.0.7\nrich\n"
    assert logic.requirements_of(text) == {
        "click": ">=8.1",
        "etcd-sdk-python": "==0.0.7",
        "rich": "",
    }
