"""SLURM awareness, the pure part: hostlists, defaults, the extra-task notice, print-config."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_run.cli.slurm.allocation import (
    SlurmDefault,
    format_print_config,
    parse_scontrol_nodelist,
    rdzv_from_slurm_job,
    should_exit_as_extra_task,
    slurm_defaults,
)
from elastic_run.cli.slurm.hostlist import expand_hostlist, first_host
from elastic_run.errors import ConfigurationError

# ---- hostlists --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("node1", ["node1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[01-04,07]", ["n01", "n02", "n03", "n04", "n07"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[001-002]", ["n001", "n002"]),
        ("gpu-a[1-2]", ["gpu-a1", "gpu-a2"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("127.0.0.[1-2],10.0.0.5", ["127.0.0.1", "127.0.0.2", "10.0.0.5"]),
        ("n[5]", ["n5"]),
        ("  n[1-2] ", ["n1", "n2"]),
    ],
)
def test_expand_hostlist(spec: str, hosts: list[str]) -> None:
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("n[1-2", "unbalanced brackets"),
        ("n1-2]", "unbalanced brackets"),
        ("n]1-2[", "unbalanced brackets"),
        ("n[[1-2]]", "nested brackets"),
        ("n[3-1]", "start > stop"),
        ("n[]", "bad range"),
        ("n[a-b]", "bad range"),
        ("n[1-]", "bad range"),
        ("n[1,,2]", "bad range"),
        ("a,,b", "empty host"),
        ("a,", "empty host"),
    ],
)
def test_bad_hostlist_raises_a_configuration_error_naming_the_spec(spec: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        expand_hostlist(spec)
    assert words in str(info.value)
    assert repr(spec) in str(info.value)
    assert info.value.exit_code == 2


def test_first_host() -> None:
    assert first_host("127.0.0.[1-2]") == "127.0.0.1"
    assert first_host("gpu[07-09],cpu1") == "gpu07"
    assert first_host("r[3-4]n[5,1]") == "r3n5"


def test_first_host_checks_the_whole_expression() -> None:
    with pytest.raises(ConfigurationError, match="bad range"):
        first_host("n[1-2],m[x]")
    with pytest.raises(ConfigurationError, match="more than 100000 hosts"):
        first_host("n[1-2],m[1-99999999999]")


@pytest.mark.parametrize("spec", ["n[1-99999999999]", "a[1-1000]b[1-1001]", "a[1-1000000],b"])
def test_one_name_past_the_librarys_100000_hosts_is_an_error(spec: str) -> None:
    with pytest.raises(ConfigurationError, match="names more than 100000 hosts") as info:
        expand_hostlist(spec)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_a_hostlist_past_a_million_names_in_all_is_an_error_before_it_is_all_expanded() -> None:
    spec = ",".join(f"g{i}n[1-100000]" for i in range(11))  # 1.1 million names
    with pytest.raises(ConfigurationError, match="names more than 1000000 hosts"):
        expand_hostlist(spec)
    assert len(expand_hostlist(",".join(f"g{i}n[1-100000]" for i in range(10)))) == 1_000_000


def test_duplicates_are_kept_in_order() -> None:
    assert expand_hostlist("b,a,b,n[1-2],n1") == ["b", "a", "b", "n1", "n2", "n1"]


def test_non_ascii_digits_are_not_a_range() -> None:
    with pytest.raises(ConfigurationError, match="bad range"):
        expand_hostlist("n[\u0663]")


@given(st.text(alphabet="ab01-9[],. ", max_size=30))
def test_any_hostlist_expands_or_is_a_configuration_error(spec: str) -> None:
    try:
        hosts = expand_hostlist(spec)
    except ConfigurationError:
        return
    assert hosts and all(hosts)
    assert first_host(spec) == hosts[0]


# ---- defaults ---------------------------------------------------------------------

ALLOC = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
}


def _as_dict(chosen: list[SlurmDefault]) -> dict[str, str]:
    return {item.name: item.value for item in chosen}


def test_nothing_outside_an_allocation() -> None:
    assert slurm_defaults({"SLURM_JOB_NUM_NODES": "2"}, given={}, elastic_min=None) == []


def test_batch_script_defaults_use_the_job_id() -> None:
    chosen = slurm_defaults(ALLOC, given={}, elastic_min=None)
    assert _as_dict(chosen) == {
        "rdzv_id": "4242",
        "nnodes": "2",
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:29400",
    }
    reasons = {item.name: item.reason for item in chosen}
    assert reasons["rdzv_endpoint"].startswith("first host of SLURM_JOB_NODELIST=127.0.0.[1-2]")
    assert reasons["nnodes"] == "from SLURM_JOB_NUM_NODES=2"
    assert reasons["rdzv_id"] == "from SLURM_JOB_ID=4242"


def test_a_step_id_joins_the_rdzv_id() -> None:
    chosen = slurm_defaults({**ALLOC, "SLURM_STEP_ID": "3"}, given={}, elastic_min=None)
    rdzv_id = next(item for item in chosen if item.name == "rdzv_id")
    assert rdzv_id == SlurmDefault(
        "rdzv_id", "4242-3", "from SLURM_JOB_ID=4242 and SLURM_STEP_ID=3"
    )


@pytest.mark.parametrize("pseudo", ["4294967294", "4294967295", "batch", "extern"])
def test_pseudo_steps_do_not_join_the_rdzv_id(pseudo: str) -> None:
    chosen = slurm_defaults({**ALLOC, "SLURM_STEP_ID": pseudo}, given={}, elastic_min=None)
    assert _as_dict(chosen)["rdzv_id"] == "4242"


def test_old_names_slurm_nnodes_and_nodelist_work() -> None:
    environ = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODELIST": "n[3-5]"}
    chosen = _as_dict(slurm_defaults(environ, given={}, elastic_min=None))
    assert chosen["nnodes"] == "3"
    assert chosen["rdzv_endpoint"] == "n3:29400"


def test_explicit_flags_win() -> None:
    given = {
        "rdzv_id": "mine",
        "nnodes": "1:2",
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "login:1234",
        "nproc_per_node": 3,
    }
    environ = {**ALLOC, "SLURM_STEP_ID": "0", "SLURM_GPUS_ON_NODE": "8"}
    assert slurm_defaults(environ, given=given, elastic_min=1) == []


def test_given_backend_etcd_gets_the_etcd_port() -> None:
    chosen = _as_dict(slurm_defaults(ALLOC, given={"rdzv_backend": "etcd"}, elastic_min=None))
    assert chosen["rdzv_endpoint"] == "127.0.0.1:2379"
    assert "rdzv_backend" not in chosen


def test_static_backend_gets_no_endpoint() -> None:
    chosen = _as_dict(slurm_defaults(ALLOC, given={"rdzv_backend": "static"}, elastic_min=None))
    assert "rdzv_endpoint" not in chosen


def test_elastic_min_gives_min_max() -> None:
    environ = {**ALLOC, "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "n[1-4]"}
    chosen = slurm_defaults(environ, given={}, elastic_min=2)
    nnodes = next(item for item in chosen if item.name == "nnodes")
    assert nnodes.value == "2:4"
    assert "SLURM_JOB_NUM_NODES=4" in nnodes.reason


def test_min_colon_form_takes_max_from_the_allocation() -> None:
    environ = {**ALLOC, "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "n[1-4]"}
    chosen = slurm_defaults(environ, given={"nnodes": "2:"}, elastic_min=None)
    nnodes = next(item for item in chosen if item.name == "nnodes")
    assert nnodes == SlurmDefault(
        "nnodes", "2:4", "MIN from --nnodes 2:, MAX from SLURM_JOB_NUM_NODES=4"
    )


def test_min_colon_form_outside_an_allocation_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="needs a Slurm allocation"):
        slurm_defaults({}, given={"nnodes": "2:"}, elastic_min=None)


@pytest.mark.parametrize(("nnodes", "words"), [("3:", "more than the 2 nodes"), ("x:", "MIN")])
def test_bad_min_colon_values(nnodes: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        slurm_defaults(ALLOC, given={"nnodes": nnodes}, elastic_min=None)


def test_bad_node_count_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="SLURM_JOB_NUM_NODES"):
        slurm_defaults({**ALLOC, "SLURM_JOB_NUM_NODES": "two"}, given={}, elastic_min=None)


def test_gpus_on_node_set_nproc_per_node() -> None:
    chosen = slurm_defaults({**ALLOC, "SLURM_GPUS_ON_NODE": "4"}, given={}, elastic_min=None)
    nproc = next(item for item in chosen if item.name == "nproc_per_node")
    assert nproc == SlurmDefault("nproc_per_node", "4", "from SLURM_GPUS_ON_NODE=4")


@pytest.mark.parametrize(
    "environ_extra", [{}, {"SLURM_GPUS_ON_NODE": "0"}, {"SLURM_NTASKS_PER_NODE": "4"}]
)
def test_no_gpus_leaves_nproc_per_node_to_torchrun(environ_extra: dict[str, str]) -> None:
    chosen = slurm_defaults({**ALLOC, **environ_extra}, given={}, elastic_min=None)
    assert "nproc_per_node" not in _as_dict(chosen)


# ---- the extra-task notice --------------------------------------------------------


@pytest.mark.parametrize("environ", [{}, {"SLURM_LOCALID": "0", "SLURMD_NODENAME": "n1"}])
def test_local_id_zero_runs_the_agent(environ: dict[str, str]) -> None:
    assert should_exit_as_extra_task(environ) is None


def test_other_local_ids_exit_with_a_notice() -> None:
    notice = should_exit_as_extra_task({"SLURM_LOCALID": "1", "SLURMD_NODENAME": "gpu7"})
    assert notice == (
        "elastic-run: SLURM task with SLURM_LOCALID=1 on node gpu7 exits: "
        "one agent per node runs on SLURM_LOCALID 0"
    )
    assert "\n" not in notice


# ---- login-node lookups -----------------------------------------------------------


def test_parse_scontrol_nodelist() -> None:
    text = (
        "JobId=12 JobName=x\n   NodeList=127.0.0.[1-2] BatchHost=127.0.0.1\n"
        "   ReqNodeList=(null) ExcNodeList=(null)\n"
    )
    assert parse_scontrol_nodelist(text) == "127.0.0.[1-2]"


def test_pending_job_has_no_nodelist() -> None:
    with pytest.raises(ConfigurationError, match="pending"):
        parse_scontrol_nodelist("JobId=12\n   NodeList=(null) ReqNodeList=(null)\n")


@pytest.mark.parametrize("job", ["", "abc", "12.x", "12.0.1"])
def test_rdzv_from_slurm_job_rejects_a_bad_job_id(job: str) -> None:
    with pytest.raises(ConfigurationError, match="JOBID"):
        rdzv_from_slurm_job(job)


# ---- print-config -----------------------------------------------------------------


def test_format_print_config_aligns_names_values_and_reasons() -> None:
    text = format_print_config(
        [
            SlurmDefault("nnodes", "2:4", "MIN from --nnodes 2:, MAX from SLURM_JOB_NUM_NODES=4"),
            ("rdzv_backend", "c10d", "inside a Slurm allocation"),
            ("max_restarts", 3, "given"),
        ]
    )
    assert text == (
        "elastic-run configuration:\n"
        "  nnodes       = 2:4   (MIN from --nnodes 2:, MAX from SLURM_JOB_NUM_NODES=4)\n"
        "  rdzv_backend = c10d  (inside a Slurm allocation)\n"
        "  max_restarts = 3     (given)\n"
    )


def test_format_print_config_empty() -> None:
    assert format_print_config([]) == "elastic-run configuration: nothing derived\n"


def test_without_python_hostlist_a_node_list_is_one_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A machine without the library (the GPU check's) runs every command but a Slurm one."""
    import sys

    monkeypatch.setitem(sys.modules, "hostlist", None)  # import hostlist -> ImportError
    with pytest.raises(ConfigurationError, match="pip install python-hostlist") as info:
        expand_hostlist("n[1-2]")
    assert info.value.exit_code == 2
