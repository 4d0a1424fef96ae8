"""The pure parts of the etcd adapter: endpoints, error classification, counters, lease verdicts."""

from __future__ import annotations

import grpc
import pyetcd.exceptions as etcd_exc
import pytest

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.endpoints import format_endpoint, parse_endpoint, parse_endpoints
from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.etcd.counter import counter_value, encode_counter, stored_count
from elastic_run.rendezvous.etcd.errors import (
    EtcdLeaseNotFoundError,
    MessageKind,
    is_unreachable,
    message_kind,
    refusal,
)
from elastic_run.rendezvous.etcd.kv import KeyValue
from elastic_run.rendezvous.etcd.lease import LeaseRecord, lease_failure, lease_is_sound

# -- endpoints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node0", ("node0", 29400)),
        ("node0:1234", ("node0", 1234)),
        (" 10.0.0.1:0 ", ("10.0.0.1", 0)),
        ("[::1]:29500", ("::1", 29500)),
        ("[fe80::1]", ("fe80::1", 29400)),
        ("fe80::1", ("fe80::1", 29400)),  # a bare IPv6 address names no port
    ],
)
def test_parse_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node0:http", "port 'http' is not in 0..65535"),
        ("node0:70000", "port '70000' is not in 0..65535"),
        (":29400", "no host"),
        ("[::1:29400", "unclosed"),
    ],
)
def test_parse_endpoint_rejects_bad_input(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_endpoint(text)


def test_parse_endpoints_reads_lists_with_schemes() -> None:
    assert parse_endpoints("a, b:2380,http://c:1/,https://[::1]:5,") == [
        ("a", 2379),
        ("b", 2380),
        ("c", 1),
        ("::1", 5),
    ]
    assert parse_endpoints("a", default_port=7) == [("a", 7)]
    with pytest.raises(ConfigurationError, match="no rendezvous endpoint"):
        parse_endpoints(" , ")
    with pytest.raises(ConfigurationError, match="port 'x'"):
        parse_endpoints("a:1,b:x")


@pytest.mark.parametrize(("host", "port"), [("node0", 1), ("10.0.0.1", 2379), ("::1", 2379)])
def test_format_endpoint_reads_back(host: str, port: int) -> None:
    assert parse_endpoint(format_endpoint(host, port)) == (host, port)


# -- error classification ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("details", "kind"),
    [
        (
            "etcdserver: authentication failed, invalid user ID or password",
            MessageKind.LOGIN_FAILED,
        ),
        ("etcdserver: user name is empty", MessageKind.NO_USER),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: "
            "Ssl handshake failed: SSL_ERROR_SSL: error:1000007d:SSL "
            "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED",
            MessageKind.TLS_HANDSHAKE,
        ),
        ("context deadline exceeded", MessageKind.SERVER_DEADLINE),
        ("failed to connect to all addresses; last error: connection refused", None),
        ("etcdserver: requested lease not found", None),
        ("", None),
    ],
)
def test_message_kind(details: str, kind: MessageKind | None) -> None:
    assert message_kind(details) is kind


def _refusal(code: grpc.StatusCode | None, reason: str, secure: bool = False) -> object:
    return refusal(
        code,
        reason,
        endpoint="h:1",
        what="get 'k'",
        user="alice",
        secure=secure,
        ca_cert="ca.pem",
    )


def test_refusal_is_decided_by_code_first() -> None:
    lost = _refusal(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")
    assert isinstance(lost, EtcdLeaseNotFoundError)
    # The code decides, whatever the text says.
    assert isinstance(_refusal(grpc.StatusCode.NOT_FOUND, "anything"), EtcdLeaseNotFoundError)
    assert _refusal(grpc.StatusCode.UNAVAILABLE, "lease not found") is None
    denied = _refusal(grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    assert isinstance(denied, RendezvousError) and "denied user 'alice'" in str(denied)
    login = _refusal(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: authentication failed")
    assert str(login) == "etcd h:1 rejected the credentials for user 'alice'"
    # A handshake failure is a refusal only on a TLS channel; otherwise it is unreachable.
    ssl = "Ssl handshake failed: CERTIFICATE_VERIFY_FAILED"
    assert "TLS handshake" in str(_refusal(grpc.StatusCode.UNAVAILABLE, ssl, secure=True))
    assert _refusal(grpc.StatusCode.UNAVAILABLE, ssl, secure=False) is None
    assert _refusal(None, "connection refused") is None


def test_a_watch_a_member_never_created_is_a_member_not_reached() -> None:
    # A frozen member holds the stream open and never answers the create: fail over.
    assert is_unreachable(None, etcd_exc.WatchTimedOut())
    assert is_unreachable(grpc.StatusCode.UNAVAILABLE, Exception("leader changed"))
    assert not is_unreachable(None, etcd_exc.RevisionCompactedError(3))


def test_a_member_whose_own_deadline_passed_was_not_reached() -> None:
    # etcd 3.4 answers a login or a linearizable read it could not serve without a leader
    # with UNKNOWN and Go's context error; any other UNKNOWN is a refusal.
    timeout = Exception("context deadline exceeded")
    assert is_unreachable(grpc.StatusCode.UNKNOWN, timeout, "context deadline exceeded")
    assert not is_unreachable(grpc.StatusCode.UNKNOWN, timeout, "etcdserver: invalid auth token")
    assert not is_unreachable(grpc.StatusCode.UNKNOWN, timeout)


# -- counters -----------------------------------------------------------------------------


def _kv(value: bytes, version: int = 1) -> KeyValue:
    return KeyValue("k", value, mod_revision=5, create_revision=3, lease_id=0, version=version)


def test_counter_reads_base_plus_puts() -> None:
    assert encode_counter(1) == b'{"counter_base":1}'
    assert counter_value(_kv(encode_counter(1), version=1)) == 1
    assert counter_value(_kv(encode_counter(1), version=9)) == 9
    assert counter_value(_kv(encode_counter(-4), version=5)) == 0
    assert counter_value(_kv(b"41")) is None
    assert counter_value(_kv(b'{"counter_base":x}')) is None
    assert stored_count("k", None) == 0
    assert stored_count("k", _kv(b"41")) == 41
    assert stored_count("k", _kv(encode_counter(2), version=3)) == 4
    with pytest.raises(RendezvousError, match="not a counter or an integer"):
        stored_count("k", _kv(b"garbage"))


# -- lease verdicts -----------------------------------------------------------------------


def test_a_lease_refreshed_within_its_ttl_is_alive() -> None:
    record = LeaseRecord(0xAB, ttl_s=3, refreshed_at_s=100.0, attempted_at_s=102.0)
    assert lease_failure(record, 100.0) is None
    assert lease_failure(record, 102.9) is None


def test_a_lease_past_its_ttl_says_why() -> None:
    failed = LeaseRecord(
        0xAB,
        ttl_s=3,
        refreshed_at_s=100.0,
        attempted_at_s=102.0,
        last_error=RendezvousError("etcd h:1 cannot be reached to refresh a lease: refused"),
    )
    verdict = lease_failure(failed, 103.5)
    assert verdict is not None and not verdict.is_expired
    assert "lease ab was last refreshed 3.5 s ago, past its TTL of 3 s" in verdict.reason
    assert "cannot be reached" in verdict.reason
    pending = LeaseRecord(0xAB, 3, 100.0, attempted_at_s=101.0, is_pending=True)
    verdict = lease_failure(pending, 104.0)
    assert verdict is not None and "a refresh sent 3.0 s ago has had no answer" in verdict.reason
    idle = LeaseRecord(0xAB, 3, 100.0, 100.0)
    verdict = lease_failure(idle, 103.0)
    assert verdict is not None and "no refresh was attempted" in verdict.reason


def test_a_lease_is_sound_for_a_join_only_while_its_refreshes_go_through() -> None:
    # TTL 3 s, last refresh sent at 100 and answered: sound until 103.
    ok = LeaseRecord(0xAB, 3, refreshed_at_s=100.0, attempted_at_s=100.0)
    assert lease_is_sound(ok, 101.0) and lease_is_sound(ok, 102.9)
    assert not lease_is_sound(ok, 103.0)
    # A refresh in flight for less than the keeper's period (TTL/3) is the normal case ...
    pending = LeaseRecord(0xAB, 3, refreshed_at_s=100.0, attempted_at_s=101.0, is_pending=True)
    assert lease_is_sound(pending, 101.5)
    # ... one that waits longer (sent into a partition) may be answered after etcd expired it.
    assert not lease_is_sound(pending, 102.0)
    assert lease_failure(pending, 102.0) is None  # not lapsed, yet doubtful
    failed = LeaseRecord(
        0xAB, 3, 100.0, 101.0, last_error=RendezvousError("etcd cannot be reached")
    )
    assert lease_failure(failed, 101.5) is None and not lease_is_sound(failed, 101.5)
    expired = LeaseRecord(0xAB, 3, 100.0, 100.5, is_expired=True)
    assert not lease_is_sound(expired, 100.6)


def test_an_expired_lease_is_expired_at_once() -> None:
    record = LeaseRecord(0xAB, 3, refreshed_at_s=100.0, attempted_at_s=100.5, is_expired=True)
    verdict = lease_failure(record, 100.5)
    assert verdict is not None and verdict.is_expired
    assert "expired" in verdict.reason
