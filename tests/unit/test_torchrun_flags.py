"""argparse-style abbreviations, torchrun's filter lists and the teed-line prefix."""

from __future__ import annotations

import pytest

from elastic_run.agent.settings.values import parse_filters
from elastic_run.agent.workers.console import tee_prefix
from elastic_run.cli.options.torchrun_flags import expand_prefixes
from elastic_run.errors import ConfigurationError

FLAGS = ["--nnodes", "--nproc-per-node", "--nproc_per_node", "--redirects", "--rdzv-id",
         "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--standalone", "--no-python"]  # fmt: skip
VALUED = ["--nnodes", "--nproc-per-node", "--nproc_per_node", "--redirects", "-r", "--rdzv-id",
          "--rdzv_id", "--rdzv-conf", "--rdzv_conf"]  # fmt: skip


def expand(*args: str) -> list[str]:
    return expand_prefixes(list(args), FLAGS, VALUED)


def test_unambiguous_prefixes_are_spelled_out() -> None:
    assert expand("--redirect=3", "--stand", "train.py") == [
        "--redirects=3",
        "--standalone",
        "train.py",
    ]
    assert expand("--nproc", "2", "train.py") == ["--nproc-per-node", "2", "train.py"]
    assert expand("--nproc_per", "2", "x.py") == ["--nproc_per_node", "2", "x.py"]


def test_a_value_or_the_script_and_its_arguments_are_never_expanded() -> None:
    assert expand("--rdzv-id", "--stand", "x.py") == ["--rdzv-id", "--stand", "x.py"]
    assert expand("-r", "3", "x.py", "--stand", "--nproc") == [
        "-r",
        "3",
        "x.py",
        "--stand",
        "--nproc",
    ]
    assert expand("--", "--stand") == ["--", "--stand"]


def test_an_ambiguous_prefix_is_torchruns_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        expand("--n=2", "x.py")
    assert str(info.value) == (
        "ambiguous option: --n=2 could match --nnodes, --no-python, --nproc-per-node, "
        "--nproc_per_node"
    )
    with pytest.raises(ConfigurationError, match="could match --rdzv-conf, --rdzv-id"):
        expand("--rdzv", "x", "x.py")


def test_an_unknown_flag_is_left_to_click() -> None:
    assert expand("--bogus", "x.py") == ["--bogus", "x.py"]


def test_filters_are_torchruns_comma_separated_list() -> None:
    assert parse_filters("") == ()
    assert parse_filters("apple,orange") == ("apple", "orange")
    assert parse_filters("a,,b,c") == ("a,b", "c")


def test_tee_prefix_is_torchruns_header_or_the_template() -> None:
    assert tee_prefix(None, role="default", rank=5, local_rank=1) == "[default1]:"
    assert tee_prefix(
        "[${role_name}:${rank}/${local_rank}] ", role="trainer", rank=5, local_rank=1
    ) == ("[trainer:5/1] ")
    assert tee_prefix("${unknown}|", role="r", rank=0, local_rank=0) == "${unknown}|"
