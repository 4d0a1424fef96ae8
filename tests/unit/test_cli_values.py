"""The pure parsers of the CLI's flag values and of --rdzv-conf: a checked value or one
ConfigurationError, never another exception."""

from __future__ import annotations

import math
import re
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_run.agent.config import Std, StdSpec
from elastic_run.agent.settings.table import SETTINGS, by_name
from elastic_run.agent.settings.values import (
    MAX_NPROC_PER_NODE,
    MAX_RUN_ID_CHARS,
    MAX_SECONDS,
    check_count,
    check_endpoint_ports,
    check_port,
    check_seconds,
    parse_int,
    parse_local_ranks,
    parse_nproc,
    parse_seconds,
    parse_signals,
    parse_std,
    safe_run_id,
    shown,
)
from elastic_run.cli.options.rdzv_conf import parse_rdzv_conf, validate_rdzv_conf
from elastic_run.cli.options.sources import Readings, read_settings
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import MAX_NODES, parse_bool, parse_nnodes


def _no_cuda() -> int:
    return 0


# ---- numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", (1, 1)), ("2:4", (2, 4)), (" 3 ", (3, 3)), ("1:1000000", (1, MAX_NODES))],
)
def test_parse_nnodes(text: str, expected: tuple[int, int]) -> None:
    assert parse_nnodes(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0", "at least 1"),
        ("4:2", "MAX must not be less"),
        ("a:b", "not N or MIN:MAX"),
        ("1:2:3", "not N or MIN:MAX"),
        ("", "not N or MIN:MAX"),
        ("1.5", "not N or MIN:MAX"),
        ("\u00b2", "not N or MIN:MAX"),
        ("99999999999999999999999", "more than 1000000 nodes"),
        ("1:1000001", "more than 1000000 nodes"),
        ("9" * 5000, "far too large"),
    ],
)
def test_parse_nnodes_rejects(text: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        parse_nnodes(text)


def test_parse_nproc_forms() -> None:
    assert parse_nproc("4", cpu_count=8, cuda_device_count=_no_cuda) == 4
    assert parse_nproc("cpu", cpu_count=8, cuda_device_count=_no_cuda) == 8
    assert parse_nproc("auto", cpu_count=8, cuda_device_count=_no_cuda) == 8
    assert parse_nproc("auto", cpu_count=8, cuda_device_count=lambda: 2) == 2
    assert parse_nproc("GPU", cpu_count=8, cuda_device_count=lambda: 2) == 2
    # torch's auto: the accelerator's devices (CUDA, else XPU), else the CPUs
    xpus = {"xpu_device_count": lambda: 3}
    assert parse_nproc("auto", cpu_count=8, cuda_device_count=_no_cuda, **xpus) == 3
    assert parse_nproc("auto", cpu_count=8, cuda_device_count=lambda: 2, **xpus) == 2
    assert parse_nproc(str(MAX_NPROC_PER_NODE), cpu_count=1, cuda_device_count=_no_cuda) == 1024


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0", "at least 1"),
        ("-1", "at least 1"),
        ("many", "not a number, cpu, gpu, xpu or auto"),
        ("gpu", "no CUDA device"),
        ("1025", "more workers per node than any machine runs"),
        ("100000000", "more workers per node than any machine runs"),
        ("99999999999999999999999", "more workers per node than any machine runs"),
    ],
)
def test_parse_nproc_rejects(text: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        parse_nproc(text, cpu_count=4, cuda_device_count=_no_cuda)


def test_check_count_and_ports() -> None:
    assert check_count(5, "--max-restarts", 0, 10) == 5
    with pytest.raises(ConfigurationError, match=r"--max-restarts 11 is out of range \(0..10\)"):
        check_count(11, "--max-restarts", 0, 10)
    with pytest.raises(ConfigurationError, match=r"\.\.\. is out of range"):
        check_count(10**100, "--node-rank", 0, 10)  # a huge number is shortened
    assert check_port(None, "--master-port") is None
    assert check_port(0, "--master-port") == 0
    with pytest.raises(ConfigurationError, match="0..65535"):
        check_port(65536, "--master-port")


@pytest.mark.parametrize("text", ["12", "+3", "-4", " 7 "])
def test_parse_int(text: str) -> None:
    assert parse_int(text, "X") == int(text)


@pytest.mark.parametrize("text", ["", "1.0", "0x10", "1_000", "\u0663", "9" * 31])
def test_parse_int_rejects(text: str) -> None:
    with pytest.raises(ConfigurationError, match="^X "):
        parse_int(text, "X")


# ---- durations --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.001, 1.0, 30.0, MAX_SECONDS])
def test_check_seconds_accepts(value: float) -> None:
    assert check_seconds(value, "--monitor-interval") == value


@pytest.mark.parametrize(
    ("value", "allow_zero", "words"),
    [
        (math.nan, False, "not a finite number"),
        (math.inf, False, "not a finite number"),
        (-math.inf, True, "not a finite number"),
        (0.0, False, "must be positive"),
        (-1.0, True, "must not be negative"),
        (MAX_SECONDS * 1.01, False, "more than a year"),
        (1e300, True, "more than a year"),
    ],
)
def test_check_seconds_rejects(value: float, allow_zero: bool, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        check_seconds(value, "--monitor-interval", allow_zero=allow_zero)


def test_check_seconds_zero_where_allowed() -> None:
    assert check_seconds(0.0, "--shutdown-timeout", allow_zero=True) == 0.0


@given(st.one_of(st.text(), st.floats().map(repr), st.floats().map(str), st.integers().map(str)))
def test_any_text_is_a_duration_in_range_or_a_configuration_error(text: str) -> None:
    try:
        value = parse_seconds(text, "--rdzv-conf join_timeout")
    except ConfigurationError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(value) and 0 < value <= MAX_SECONDS


@given(st.text())
def test_any_text_is_nnodes_or_a_configuration_error(text: str) -> None:
    try:
        low, high = parse_nnodes(text)
    except ConfigurationError:
        return
    assert 1 <= low <= high <= MAX_NODES


@given(st.text())
def test_any_text_is_nproc_or_a_configuration_error(text: str) -> None:
    try:
        count = parse_nproc(text, cpu_count=4, cuda_device_count=_no_cuda)
    except ConfigurationError:
        return
    assert 1 <= count <= MAX_NPROC_PER_NODE


# ---- streams, ranks, signals, endpoints ---------------------------------------------------


def test_parse_std() -> None:
    assert parse_std("", "--tee") == StdSpec()
    assert parse_std("3", "--tee") == StdSpec(default=Std.ALL)
    assert parse_std("0:1, 1:2", "--tee") == StdSpec(per_rank=((0, Std.OUT), (1, Std.ERR)))


@pytest.mark.parametrize("text", ["7", "0:x,1", "\u00b2:1", "a:1", "9999999:1", "1024:1"])
def test_parse_std_rejects(text: str) -> None:
    with pytest.raises(ConfigurationError, match="--redirects"):
        parse_std(text, "--redirects")


def test_parse_local_ranks() -> None:
    assert parse_local_ranks("") is None
    assert parse_local_ranks("0, 2") == frozenset({0, 2})
    for bad in ("a", "-1", "1,,2", "\u00b2", "99999999999999999999"):
        with pytest.raises(ConfigurationError, match="--local-ranks-filter"):
            parse_local_ranks(bad)


def test_parse_signals() -> None:
    assert parse_signals("SIGTERM, int,") == (signal.SIGTERM, signal.SIGINT)
    for bad, words in (("SIGNOPE", "unknown signal"), ("KILL", "cannot be handled")):
        with pytest.raises(ConfigurationError, match=words):
            parse_signals(bad)


@pytest.mark.parametrize(
    ("endpoint", "ports"),
    [
        ("", ()),
        ("host", ()),
        ("host:0", (0,)),
        ("a:1, b:65535", (1, 65535)),
        ("[::1]:29400", (29400,)),
        ("fe80::1", ()),  # a bare IPv6 address: no port
    ],
)
def test_check_endpoint_ports_accepts(endpoint: str, ports: tuple[int, ...]) -> None:
    assert check_endpoint_ports(endpoint) == ports


@pytest.mark.parametrize("endpoint", ["host:99999", "host:x", "host:\u00b2", "a:1,b:65536"])
def test_check_endpoint_ports_rejects(endpoint: str) -> None:
    with pytest.raises(ConfigurationError, match="not in 0..65535"):
        check_endpoint_ports(endpoint)


@pytest.mark.parametrize("text", ["1", "0", "TRUE", "false", "t", "F", "yes", "No", "y", "N"])
def test_parse_bool(text: str) -> None:
    assert parse_bool(text, "is_host") is (text.lower() in ("1", "true", "t", "yes", "y"))


def test_shown_is_one_short_line() -> None:
    assert shown("a\nb") == "'a\\nb'"
    assert len(shown("x" * 1000)) <= 62


# ---- run ids ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "safe"),
    [
        ("job-42.a_b", "job-42.a_b"),
        ("../../etc", ".._.._etc"),
        ("a/b", "a_b"),
        ("x\ny\x00", "x_y_"),
        (".", "_"),
        ("..", "__"),
        ("...", "___"),
        ("caf\u00e9", "caf_"),
    ],
)
def test_safe_run_id(given: str, safe: str) -> None:
    assert safe_run_id(given) == safe


def test_a_long_run_id_keeps_its_start_and_stays_distinct() -> None:
    first, second = safe_run_id("j" * 300), safe_run_id("j" * 301)
    assert len(first) == len(second) == MAX_RUN_ID_CHARS
    assert first.startswith("j" * 100) and first != second


@pytest.mark.parametrize("given", ["", "   ", "\t"])
def test_an_empty_run_id_is_an_error(given: str) -> None:
    with pytest.raises(ConfigurationError, match="must not be empty"):
        safe_run_id(given)


@given(st.text(min_size=1).filter(lambda s: s.strip() != ""))
def test_a_safe_run_id_is_a_plain_directory_name(given: str) -> None:
    safe = safe_run_id(given)
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,128}", safe)
    assert safe.strip(".") != ""
    assert safe_run_id(safe) == safe  # stable: every node, and status, compute the same


# ---- --rdzv-conf ------------------------------------------------------------------------


def test_parse_rdzv_conf() -> None:
    assert parse_rdzv_conf("") == ()
    assert parse_rdzv_conf(" a = 1 ,b=2, a=3") == (("a", "3"), ("b", "2"))
    for empty in ("k=", "a=1, k = "):  # torch refuses an empty value too
        with pytest.raises(ConfigurationError, match="'k' has no value"):
            parse_rdzv_conf(empty)
    for bad in ("timeout", "=1", "a=1,,b=2"):
        with pytest.raises(ConfigurationError, match="expected key=value"):
            parse_rdzv_conf(bad)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (
            "join_timeout=600,last_call_timeout=0.5,close_timeout=30,heartbeat_timeout=5",
            {
                "join_timeout": 600.0,
                "last_call_timeout": 0.5,
                "close_timeout": 30.0,
                "heartbeat_timeout": 5.0,
            },
        ),
        (
            "keep_alive_interval=0.5,keep_alive_max_attempt=1000,read_timeout=31536000,timeout=1",
            {
                "keep_alive_interval": 0.5,
                "keep_alive_max_attempt": 1000,
                "read_timeout": 31536000.0,
                "timeout": 1.0,
            },
        ),
        (
            "is_host=TRUE,use_libuv=n,store_type=File,protocol=HTTPS",
            {"is_host": True, "use_libuv": False, "store_type": "file", "protocol": "https"},
        ),
        # Unknown keys: not this check's to read; the etcd TLS files and the static rank are
        # rows of the table.
        ("no_such_key=nan,rank=3,ca_cert=/x", {"rank": 3, "ca_cert": "/x"}),
        ("cacert=/old,ca_cert=/new", {"ca_cert": "/new"}),  # the key's own name wins
    ],
)
def test_validate_rdzv_conf_accepts(text: str, parsed: dict[str, object]) -> None:
    conf = validate_rdzv_conf(parse_rdzv_conf(text))
    values = conf.values
    assert values == parsed
    assert conf.given == parse_rdzv_conf(text)  # every pair as given, for torch and plugins
    # Each value has the kind the rendezvous reads (2 == 2.0 would hide an int for a float).
    assert {k: type(v) for k, v in values.items()} == {k: type(v) for k, v in parsed.items()}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("keep_alive_interval=nan", "keep_alive_interval nan is not a finite"),
        ("keep_alive_interval=inf", "not a finite"),
        ("join_timeout=-inf", "not a finite"),
        ("read_timeout=1e300", "more than a year"),
        ("timeout=31536001", "more than a year"),
        ("heartbeat_timeout=0", "must be positive"),
        ("close_timeout=soon", "not a number of seconds"),
        ("last_call_timeout=-1", "must be positive"),
        ("last_call_timeout=0", "must be positive"),  # as torch's RendezvousTimeout
        ("keep_alive_max_attempt=0", "out of range (1..1000)"),
        ("keep_alive_max_attempt=1001", "out of range (1..1000)"),
        ("keep_alive_max_attempt=2.5", "not a whole number"),
        ("keep_alive_max_attempt=99999999999999999999", "not a whole number"),
        ("is_host=maybe", "not a boolean"),
        ("use_libuv=2", "not a boolean"),
        ("store_type=redis", "must be tcp or file"),
        ("protocol=ftp", "must be http or https"),
    ],
)
def test_validate_rdzv_conf_rejects(text: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        validate_rdzv_conf(parse_rdzv_conf(text))


@given(st.text())
def test_any_rdzv_conf_text_is_pairs_or_a_configuration_error(text: str) -> None:
    try:
        validate_rdzv_conf(parse_rdzv_conf(text))
    except ConfigurationError as exc:
        assert "\n" not in str(exc)


# ---- every setting read from any source: one parser, one wording ------------------------------

NUMERIC = {
    # name: whether 0 is a value (every setting refuses abc, inf, nan, -1, huge)
    "nnodes": False,
    "nproc_per_node": False,
    "max_restarts": True,
    "monitor_interval": False,
    "node_rank": True,
    "master_port": True,
    "shutdown_timeout": True,
    "health_check_port": True,
    "health_check_timeout": False,
    "exit_barrier_timeout": True,
    "elastic_min": False,
    "hang_timeout": True,  # 0: off
    "straggler_factor": False,
    "max_no_progress_restarts": True,
    "script_exit_timeout": True,  # 0: off
}
BAD = ["abc", "inf", "-inf", "nan", "-1", "9" * 40, "1e300", "", "1.5.2"]


def _read(params: dict[str, object], environ: dict[str, str]) -> Readings:
    return read_settings(params, set(params), environ)


def _error(params: dict[str, object], environ: dict[str, str]) -> str:
    with pytest.raises(ConfigurationError) as caught:
        _read(params, environ)
    message = str(caught.value)
    assert "\n" not in message and message, message
    return message


def test_every_numeric_setting_is_a_row() -> None:
    assert {s.name for s in SETTINGS if s.name in NUMERIC} == set(NUMERIC)


@pytest.mark.parametrize("name", list(NUMERIC))
@pytest.mark.parametrize("text", BAD + ["0"])
def test_a_bad_number_is_one_line_naming_its_source_whatever_the_source(
    name: str, text: str
) -> None:
    setting = by_name(name)
    if text == "0" and NUMERIC[name]:
        _read({name: text}, {})
        return
    if text == "":  # an empty variable is unset, as click reads one; empty on the command line
        assert _read({}, {str(setting.pet_env): ""}).sources[name] == "default"
        if name in ("hang_timeout", "script_exit_timeout"):
            return  # "" is not "off": refused below like any other text
    from_flag = _error({name: text}, {})
    assert from_flag.startswith(str(setting.flag)), from_flag
    if text == "":
        return
    from_pet = _error({}, {str(setting.pet_env): text})
    assert from_pet == from_flag.replace(str(setting.flag), str(setting.pet_env), 1)
    if setting.torch_env is not None:
        from_torch = _error({}, {setting.torch_env: text})
        assert from_torch == from_flag.replace(str(setting.flag), setting.torch_env, 1)


def test_the_command_line_wins_then_pet_then_torchs_variable_then_slurm_then_the_default() -> None:
    environ = {
        "PET_SHUTDOWN_TIMEOUT": "5",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7",
        "PET_HEALTH_CHECK_PORT": "",  # empty: unset
        "TORCHELASTIC_HEALTH_CHECK_PORT": "8080",
        "TORCHELASTIC_ENABLE_FILE_TIMER": "yes",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "PET_RDZV_BACKEND": "etcd",
    }
    readings = read_settings({"shutdown_timeout": "3"}, {"shutdown_timeout"}, environ)
    assert (readings.values["shutdown_timeout"], readings.sources["shutdown_timeout"]) == (
        3.0,
        "given",
    )
    readings = read_settings({}, set(), environ)
    assert readings.values["shutdown_timeout"] == 5.0
    assert readings.sources["shutdown_timeout"] == "from PET_SHUTDOWN_TIMEOUT"
    assert readings.values["health_check_port"] == 8080
    assert readings.sources["health_check_port"] == "from TORCHELASTIC_HEALTH_CHECK_PORT"
    assert readings.values["watchdog"] is True
    assert readings.values["rdzv_backend"] == "etcd"  # PET_ beats the allocation's c10d
    assert readings.values["rdzv_endpoint"] == "n1:2379"
    assert "SLURM_JOB_NODELIST" in readings.sources["rdzv_endpoint"]
    assert readings.values["nnodes"] == (2, 2)
    assert readings.sources["max_restarts"] == "default"
    assert readings.given == {"shutdown_timeout", "health_check_port", "watchdog", "rdzv_backend"}
    without = read_settings({}, set(), {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"})
    assert without.values["shutdown_timeout"] == 7.0


@pytest.mark.parametrize("text", ["1", "true", "YES", "on", "t", "y"])
def test_a_flags_variable_reads_as_click_read_it(text: str) -> None:
    readings = _read({}, {"PET_STANDALONE": text, "PET_WARM_START": text.swapcase()})
    assert readings.values["standalone"] is True and readings.values["warm_start"] is True
    assert _read({}, {"PET_STANDALONE": "0"}).values["standalone"] is False


def test_a_bad_flag_variable_is_one_line() -> None:
    assert _error({}, {"PET_STANDALONE": "maybe"}).startswith("PET_STANDALONE 'maybe'")
    # torch reads TORCHELASTIC_ENABLE_FILE_TIMER leniently: anything but 1/true/... is off.
    assert _read({}, {"TORCHELASTIC_ENABLE_FILE_TIMER": "maybe"}).values["watchdog"] is False


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("start_method", "thread", "is not one of 'spawn', 'fork', 'forkserver'"),
        ("numa_binding", "all", "is not one of 'node', 'socket', 'exclusive', 'core-complex'"),
        ("signals_to_handle", "SIGNOPE", "unknown signal"),
        ("redirects", "7", "expected 0..3"),
        ("local_ranks_filter", "a", "expected local ranks"),
        ("rdzv_endpoint", "host:99999", "not in 0..65535"),
        ("preload", "a-b", "is not a module name"),
    ],
)
def test_the_other_kinds_name_their_source_too(name: str, text: str, words: str) -> None:
    setting = by_name(name)
    from_flag, from_pet = _error({name: text}, {}), _error({}, {str(setting.pet_env): text})
    assert words in from_flag and str(setting.flag) in from_flag
    assert from_pet == from_flag.replace(str(setting.flag), str(setting.pet_env), 1)
