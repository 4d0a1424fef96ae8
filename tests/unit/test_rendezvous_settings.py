"""One table, one set of checks: every path to the rendezvous settings gets the same defaults and
refuses the same values (--rdzv-conf text, RendezvousSettings, RendezvousTimeout, the node counts,
the static handlers, the Slurm allocation's node counts). Pure: no store is reached."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from elastic_run.cli.slurm.allocation import node_count, slurm_defaults
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import rendezvous_handler_registry
from elastic_run.rendezvous.settings import (
    CONF_TABLE,
    MAX_NODES,
    ConfigurationTypeError,
    RendezvousSettings,
    RendezvousTimeout,
    check_nnodes,
    check_setting,
    parse_bool,
    parse_conf_value,
    parse_nnodes,
)
from elastic_run.rendezvous.static import create_rdzv_handler

ALLOC = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "n[1-4]"}


def params(backend: str = "c10d", min_nodes: int = 1, max_nodes: int = 1, **conf: Any) -> Any:
    return RendezvousParameters(backend, "127.0.0.1:29500", "job", min_nodes, max_nodes, **conf)


# ---- defaults: the table's, on every path --------------------------------------------------


def test_the_defaults_are_torchs_and_ours_on_every_path() -> None:
    # torch's join/last-call/close/heartbeat (600/30/30/5); ours for the keep-alive (1 s x 5:
    # torch's 5 s x 3) and a store call (60 s); the same from the table, the settings, torch's
    # typed timeouts and the parameters.
    table = {key: CONF_TABLE[key].default for key in CONF_TABLE}
    assert {k: table[k] for k in ("join_timeout", "last_call_timeout", "close_timeout")} == {
        "join_timeout": 600,
        "last_call_timeout": 30,
        "close_timeout": 30,
    }
    assert (table["heartbeat_timeout"], table["keep_alive_interval"]) == (5, 1)
    assert (table["keep_alive_max_attempt"], table["read_timeout"]) == (5, 60)
    settings = RendezvousSettings()
    assert settings.join_timeout_s == CONF_TABLE["join_timeout"].default
    assert settings.last_call_timeout_s == CONF_TABLE["last_call_timeout"].default
    assert settings.close_timeout_s == CONF_TABLE["close_timeout"].default
    assert settings.heartbeat_timeout_s == CONF_TABLE["heartbeat_timeout"].default
    assert settings.keep_alive_interval_s == CONF_TABLE["keep_alive_interval"].default
    assert settings.keep_alive_max_attempt == CONF_TABLE["keep_alive_max_attempt"].default
    assert settings.read_timeout_s == CONF_TABLE["read_timeout"].default
    assert settings.store_type == CONF_TABLE["store_type"].default
    assert settings.protocol == CONF_TABLE["protocol"].default
    timeout = RendezvousTimeout()
    for name in ("join", "last_call", "close", "heartbeat"):
        assert getattr(timeout, name) == timedelta(seconds=CONF_TABLE[f"{name}_timeout"].default)
    assert RendezvousSettings.from_params(params()) == settings
    defaults = (
        CONF_TABLE["keep_alive_interval"].default,
        CONF_TABLE["keep_alive_max_attempt"].default,
    )
    assert RendezvousSettings.from_timeout(None, *defaults) == settings


def test_the_static_handler_has_one_set_of_rules_torchs_on_every_path() -> None:
    # The registry builds what torch's create_rdzv_handler builds: 600 s unless given (the CLI
    # gives torchrun's 900, as torchrun's LaunchConfig does: test_cli_entrypoint).
    for create in (rendezvous_handler_registry.create_handler, create_rdzv_handler):
        handler: Any = create(params("static", rank="0"))
        assert handler.timeout_s == CONF_TABLE["timeout"].default == 600
        assert create(params("static", rank="0", timeout="42")).timeout_s == 42  # type: ignore[attr-defined]
        both = params("static", rank="0", timeout="42", join_timeout="7")
        assert create(both).timeout_s == 7  # type: ignore[attr-defined]  # join_timeout wins
        with pytest.raises(ConfigurationError, match="needs 'rank'"):
            create(params("static"))
        with pytest.raises(ConfigurationError, match="needs an elastic backend"):
            create(params("static", 1, 2, rank="0"))
        with pytest.raises(ConfigurationError, match="--node-rank 1 is out of range"):
            create(params("static", rank="1"))


def test_torchs_static_handler_keeps_a_fraction_of_a_second() -> None:
    # int(0.4) made it a 0 s wait.
    handler = create_rdzv_handler(params("static", rank="0", timeout="0.4"))
    assert handler.timeout == timedelta(seconds=0.4)
    assert handler.timeout_s == 0.4
    default = create_rdzv_handler(params("static", rank="0"))
    assert default.timeout == timedelta(seconds=CONF_TABLE["timeout"].default)


# ---- bounds: one set, whatever the path ------------------------------------------------------


def test_a_zero_last_call_timeout_is_refused_on_every_path_as_torchs() -> None:
    with pytest.raises(ValueError):
        RendezvousTimeout(last_call=timedelta(0))
    with pytest.raises(ConfigurationError, match="must be positive"):
        parse_conf_value("last_call_timeout", "0")
    with pytest.raises(ConfigurationError, match="must be positive"):
        RendezvousSettings.from_params(params(last_call_timeout="0"))
    with pytest.raises(ConfigurationError, match="must be positive"):
        RendezvousSettings(last_call_timeout_s=0.0)


@pytest.mark.parametrize("attempts", [2.5, True, 0, 1001])
def test_keep_alive_attempts_are_a_whole_number_in_range_on_every_path(attempts: Any) -> None:
    with pytest.raises(ConfigurationError):
        RendezvousSettings(keep_alive_max_attempt=attempts)
    with pytest.raises(ConfigurationError):
        RendezvousSettings.from_timeout(None, 1.0, attempts)
    with pytest.raises(ConfigurationError):
        parse_conf_value("keep_alive_max_attempt", attempts)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("keep_alive_max_attempt", "5"),
        ("keep_alive_max_attempt", 2.5),
        ("keep_alive_max_attempt", True),
        ("keep_alive_interval_s", "5"),
        ("keep_alive_interval_s", True),
        ("join_timeout_s", None),
        ("is_host", "yes"),
    ],
)
def test_a_value_of_the_wrong_type_is_a_type_error_and_a_value_error(
    field: str, value: object
) -> None:
    with pytest.raises(ConfigurationTypeError) as caught:
        RendezvousSettings(**{field: value})
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
    assert field in str(caught.value)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0, 0.0, 400 * 86400.0])
def test_a_timeout_out_of_bounds_is_refused_as_the_cli_refuses_it(seconds: float) -> None:
    with pytest.raises(ConfigurationError):
        parse_conf_value("join_timeout", repr(seconds))
    with pytest.raises(ConfigurationError):
        RendezvousSettings(join_timeout_s=seconds)
    if seconds == seconds and abs(seconds) != float("inf"):
        with pytest.raises(ValueError):
            RendezvousTimeout(join=timedelta(seconds=seconds))


def test_a_timeout_that_is_not_a_timedelta_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        RendezvousTimeout(join=600)  # type: ignore[arg-type]


# ---- node counts ------------------------------------------------------------------------------


@pytest.mark.parametrize(("low", "high"), [(0, 1), (3, 1), (1, MAX_NODES + 1)])
def test_node_counts_out_of_bounds_are_refused_by_the_cli_and_the_parameters(
    low: int, high: int
) -> None:
    with pytest.raises(ConfigurationError):
        parse_nnodes(f"{low}:{high}")
    with pytest.raises(ConfigurationError):
        check_nnodes(low, high)
    with pytest.raises(ValueError):
        params(min_nodes=low, max_nodes=high)


def test_a_node_count_that_is_not_an_int_is_a_type_error() -> None:
    for low, high in ((True, 2), (1, "2")):
        with pytest.raises(TypeError):
            check_nnodes(low, high)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nnodes", "words"),
    [("\u0663:", "not a whole number"), ("0:", "at least 1"), ("x:", "MIN")],
)
def test_slurm_min_colon_is_read_by_the_one_node_count_parser(nnodes: str, words: str) -> None:
    # int() took an Arabic-Indic digit as 3; the one parser takes ASCII digits only.
    with pytest.raises(ConfigurationError, match=words):
        slurm_defaults(ALLOC, given={"nnodes": nnodes}, elastic_min=None)


@pytest.mark.parametrize(
    ("value", "words"), [("\u0664", "not a whole number"), ("2000000", "more than 1000000")]
)
def test_slurm_node_count_is_bounded_as_nnodes(value: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        node_count({**ALLOC, "SLURM_JOB_NUM_NODES": value})


# ---- booleans: one table of spellings ------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", ["1", "0", "TRUE", " false ", "t", "F", "Yes", "no", "y", "N", 1, 0, True, False]
)
def test_every_boolean_reader_agrees(raw: object) -> None:
    expected = parse_bool(raw, "is_host")
    assert parse_conf_value("is_host", raw) is expected
    assert params(is_host=raw).get_as_bool("is_host") is expected


@pytest.mark.parametrize("raw", ["maybe", "2", "", "on", 2, 1.0])
def test_every_boolean_reader_refuses_the_same(raw: object) -> None:
    with pytest.raises(ConfigurationError, match="not a boolean"):
        parse_conf_value("is_host", raw)
    with pytest.raises(ConfigurationError, match="not a boolean"):
        params(is_host=raw).get_as_bool("is_host")


def test_numpy_integers_count_as_whole_numbers_as_in_torch() -> None:
    import numpy as np

    assert check_nnodes(np.int64(2), np.int32(4)) == (2, 4)
    settings = RendezvousSettings.from_timeout(None, 1.5, np.int64(7))
    assert settings.keep_alive_max_attempt == 7 and settings.keep_alive_interval_s == 1.5
    with pytest.raises(TypeError):
        check_nnodes(True, 2)


def test_a_choice_given_from_python_is_read_as_the_text_one() -> None:
    assert check_setting("protocol", "HTTPS") == parse_conf_value("protocol", "HTTPS") == "https"


# ---- parsed once, at the edge; every key of the table -----------------------------------------


def test_parameters_are_parsed_once_and_again_only_when_their_config_changed() -> None:
    given = params(join_timeout="5")
    first = given.settings
    assert given.settings is first  # kept: the registry, the handler, the backends share it
    given.config["join_timeout"] = "6"  # torch's config is a plain dict
    assert given.settings.join_timeout_s == 6


def test_parameters_from_a_conf_parsed_at_the_edge_are_not_parsed_again() -> None:
    from elastic_run.rendezvous.settings import RendezvousConf

    conf = RendezvousConf.parse((("join_timeout", "5"), ("custom", "x")), "c10d")
    built = RendezvousParameters.from_conf("c10d", "h:1", "job", 1, 2, None, conf)
    assert built.settings is conf.settings
    assert built.config == {"join_timeout": "5", "custom": "x"}  # torch's view: as given


def test_the_etcd_keys_are_rows_of_the_table_with_torchs_older_names() -> None:
    settings = params(
        "etcd",
        cacert="/ca",
        cert="/old-cert",
        ssl_cert="/cert",
        key="/key",
        user="u",
        password="secret",
        key_prefix="/mine/",
    ).settings
    assert (settings.ca_cert, settings.ssl_cert, settings.ssl_cert_key) == ("/ca", "/cert", "/key")
    assert (settings.user, settings.password, settings.key_prefix) == ("u", "secret", "/mine/")
    assert "secret" not in repr(settings)
    assert RendezvousSettings().key_prefix == CONF_TABLE["key_prefix"].default == "/elastic-run/"


def test_no_backend_reads_a_raw_conf_key() -> None:
    # Every key is read through the one parse (RendezvousSettings): no `params.get("...")` of a
    # conf key in the rendezvous but the address (a parameter torch passes both ways).
    import re
    from pathlib import Path

    import elastic_run.rendezvous as rendezvous

    root = Path(rendezvous.__file__).parent
    reads = {
        (str(path.relative_to(root)), key)
        for path in root.rglob("*.py")
        for key in re.findall(r"params\.(?:get|get_as_\w+)\(\s*\"(\w+)\"", path.read_text())
    }
    assert {key for _, key in reads} <= {"local_addr"}, sorted(reads)


def test_a_heartbeat_completes_within_heartbeat_timeout_torchs_meaning() -> None:
    from elastic_run.rendezvous.etcd.backend import create_etcd_backend

    assert RendezvousSettings().heartbeat_deadline_s == 5.0  # torch's heartbeat_timeout
    assert RendezvousSettings(heartbeat_timeout_s=2.0).heartbeat_deadline_s == 2.0
    # Never past the heartbeat budget or a store call's read timeout; at least a second.
    budget = RendezvousSettings(keep_alive_interval_s=0.25, keep_alive_max_attempt=4)
    assert budget.heartbeat_deadline_s == 1.0
    assert RendezvousSettings(heartbeat_timeout_s=9, read_timeout_s=3).heartbeat_deadline_s == 3
    backend = create_etcd_backend(params("etcd", heartbeat_timeout="2"))  # connects lazily
    try:
        assert backend.heartbeat_timeout_s == 2.0
    finally:
        backend.close()


def test_a_key_the_backend_never_reads_is_never_refused_as_torchrun() -> None:
    # torch's c10d and etcd-v2 handlers never read `timeout`: torchrun accepts timeout=5' there.
    for backend in ("c10d", "etcd-v2"):
        settings = params(backend, timeout="5'").settings
        assert settings.join_timeout_s == 600  # not read, as torch's
    # The static backend and torch's "etcd" read it: 5' is refused there, as torch refuses it.
    for backend in ("static", "etcd"):
        with pytest.raises(ConfigurationError, match="timeout"):
            params(backend, timeout="5'").settings  # noqa: B018
    assert params("c10d", protocol="ftp").settings.protocol == "http"  # an etcd key: unread


def test_the_docs_table_of_the_conf_keys_is_made_from_the_one_table() -> None:
    from pathlib import Path

    from elastic_run.rendezvous.settings import conf_reference

    page = (Path(__file__).resolve().parents[2] / "docs" / "backends.md").read_text()
    start = page.index("<!-- conf-table: generated from CONF_TABLE -->\n")
    end = page.index("<!-- /conf-table -->")
    assert page[page.index("\n", start) + 1 : end] == conf_reference(), (
        "docs/backends.md's --rdzv-conf table differs from CONF_TABLE: paste conf_reference()"
    )
