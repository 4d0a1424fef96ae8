"""The embedded etcd cluster's pure parts: the member list, which member is this host, the
quorum verdict, and the Slurm default (the allocation's first three hosts, or one)."""

from __future__ import annotations

import pytest

from elastic_run.cli.slurm.allocation import slurm_defaults
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.embedded.cluster import (
    LocalIdentity,
    cluster_token,
    find_local_member,
    parse_cluster,
)
from elastic_run.rendezvous.embedded.quorum import quorum_verdict


def _me(
    local_addr: str | None = None, names: tuple[str, ...] = ("node7",), addrs=()
) -> LocalIdentity:  # type: ignore[no-untyped-def]
    return LocalIdentity(local_addr, frozenset(names), frozenset(addrs))


def _resolve(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    return lambda host: table.get(host, [host] if host[0].isdigit() else [])


def test_members_ports_and_initial_cluster() -> None:
    cluster = parse_cluster("h1,h2:3000,h3", "job")
    assert [m.client_endpoint for m in cluster.members] == ["h1:29410", "h2:3000", "h3:29410"]
    assert [m.peer_port for m in cluster.members] == [29411, 3001, 29411]
    assert cluster.initial_cluster("http") == (
        "m1=http://h1:29411,m2=http://h2:3001,m3=http://h3:29411"
    )
    assert (cluster.size, cluster.majority, cluster.tolerates) == (3, 2, 1)
    assert parse_cluster("a,b,c,d,e", "job").tolerates == 2
    assert cluster.token == cluster_token("job") != cluster_token("job2")


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("", "needs --rdzv-endpoint"),
        ("h1,h2", "names 2 embedded etcd members"),
        ("h1,h2,h3,h4", "names 4"),
        ("h1,h1,h2", "a member twice"),
        ("h1:29410,h1:29411,h2", "peer port"),
        ("h1:65535,h2,h3", "1..65534"),
        ("h1:x,h2,h3", "not in 0..65535"),
    ],
)
def test_bad_member_lists_are_one_line(endpoint: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse_cluster(endpoint, "job")


def test_this_host_is_the_member_named_by_local_addr_first() -> None:
    cluster = parse_cluster("127.0.0.1,127.0.0.2,127.0.0.3", "job")
    resolve = _resolve({})
    found = find_local_member(cluster, _me("127.0.0.2", addrs=("127.0.0.1",)), resolve)
    assert found is not None and (found[0].name, found[1]) == ("m2", "127.0.0.2")


def test_this_host_by_name_binds_its_local_address() -> None:
    cluster = parse_cluster("node6,node7,node8", "job")
    resolve = _resolve({"node7": ["10.0.0.9", "10.0.0.7"], "node6": ["10.0.0.6"]})
    found = find_local_member(cluster, _me(names=("node7",), addrs=("10.0.0.7",)), resolve)
    assert found is not None and (found[0].name, found[1]) == ("m2", "10.0.0.7")


def test_this_host_by_address() -> None:
    cluster = parse_cluster("n1,n2,n3", "job")
    resolve = _resolve({"n1": ["10.0.0.1"], "n2": ["10.0.0.2"], "n3": ["10.0.0.3"]})
    found = find_local_member(cluster, _me(names=("other",), addrs=("10.0.0.3",)), resolve)
    assert found is not None and (found[0].name, found[1]) == ("m3", "10.0.0.3")
    assert find_local_member(cluster, _me(names=("x",), addrs=("10.0.0.9",)), resolve) is None


def test_two_members_on_this_host_is_bad_input() -> None:
    cluster = parse_cluster("10.0.0.1,10.0.0.2,10.0.0.3", "job")
    me = _me(names=("x",), addrs=("10.0.0.1", "10.0.0.2"))
    with pytest.raises(ConfigurationError, match="several embedded etcd members"):
        find_local_member(cluster, me, _resolve({}))


def test_quorum_is_lost_only_past_the_tolerated_refusals_of_members_seen_up() -> None:
    cluster = parse_cluster("h1,h2,h3", "job")
    seen = frozenset({"m1", "m2", "m3"})
    assert quorum_verdict(cluster, {"m1": "up", "m2": "down", "m3": "up"}, seen).reason is None
    # A host cut off sees the others silent: it waits for the heal.
    silent = {"m1": "up", "m2": "silent", "m3": "silent"}
    assert quorum_verdict(cluster, silent, seen).reason is None
    # Members not started yet refuse too: not lost.
    starting = {"m1": "up", "m2": "down", "m3": "down"}
    assert quorum_verdict(cluster, starting, frozenset({"m1"})).reason is None
    lost = quorum_verdict(cluster, starting, seen)
    assert lost.lost == ("m2", "m3")
    assert lost.reason is not None and "lost its quorum" in lost.reason
    assert "h2:29410, h3:29410" in lost.reason


@pytest.mark.parametrize(
    ("nodelist", "endpoint", "notice"),
    [
        ("127.0.0.[1-5]", "127.0.0.1,127.0.0.2,127.0.0.3", ""),
        ("n[1-3]", "n1,n2,n3", ""),
        ("n[1-2]", "n1", "a two-member cluster survives nothing"),
        ("n1", "n1", ""),
    ],
)
def test_slurm_picks_the_first_three_hosts_or_one(
    nodelist: str, endpoint: str, notice: str
) -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": "5"}
    chosen = slurm_defaults(env, given={"rdzv_backend": "embedded-etcd"}, elastic_min=None)
    (row,) = [d for d in chosen if d.name == "rdzv_endpoint"]
    assert row.value == endpoint
    assert notice in row.notice and bool(row.notice) == bool(notice)
