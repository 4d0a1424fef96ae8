"""The embedded etcd members' raft timing (issue 38): the election timeout and its beat.

A leader whose host died is replaced within one or two election timeouts; etcd's default (1 s)
took 1.0 to 2.0 s of every host loss that hit the leader. The members run with 500 ms and a
beat every 50 ms unless ``--rdzv-conf election_timeout`` says otherwise. Only the command line
is built here (no etcd is started); ``scripts/bench_host_loss.py`` times what it buys.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.embedded.cluster import parse_cluster
from elastic_run.rendezvous.embedded.member import EmbeddedMember
from elastic_run.rendezvous.settings import RendezvousSettings


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _member(**kwargs: float) -> EmbeddedMember:
    cluster = parse_cluster("10.0.0.1,10.0.0.2,10.0.0.3", "job")
    return EmbeddedMember(
        cluster, cluster.members[0], "10.0.0.1", "job", binary=sys.executable, **kwargs
    )


def test_the_members_elect_within_500_ms_and_beat_every_50_by_default() -> None:
    argv = _member().command(Path("/nowhere"))
    assert _flag(argv, "--election-timeout") == "500"
    assert _flag(argv, "--heartbeat-interval") == "50"


def test_election_timeout_in_rdzv_conf_sets_both() -> None:
    settings = RendezvousSettings.parse({"election_timeout": "2"}, "embedded-etcd")
    argv = _member(election_timeout_s=settings.election_timeout_s).command(Path("/nowhere"))
    assert _flag(argv, "--election-timeout") == "2000"
    assert _flag(argv, "--heartbeat-interval") == "200"


@pytest.mark.parametrize("seconds", [0.01, 60.0])
def test_an_election_timeout_etcd_would_refuse_is_one_clear_error(seconds: float) -> None:
    with pytest.raises(
        ConfigurationError, match=r"election_timeout .* out of range \(0.05..50 s\)"
    ):
        _member(election_timeout_s=seconds)
