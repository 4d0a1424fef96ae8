"""Etcd failures: which gRPC or ``pyetcd`` error becomes which typed rendezvous error.

A failed etcd call is classified from its gRPC status code and the type of the exception,
in this order:
- UNAUTHENTICATED, PERMISSION_DENIED, a failed login, a missing user or (on TLS) a failed
  handshake: the request was refused and a retry cannot help (``RendezvousError``);
- NOT_FOUND: the lease the request named is gone (``EtcdLeaseNotFoundError``); etcd answers
  NOT_FOUND for a lease or a cluster member, and the adapter never names a member;
- UNAVAILABLE, DEADLINE_EXCEEDED, pyetcd's connection errors, a watch the member did not
  create within the RPC deadline (``WatchTimedOut``: a frozen or partitioned member holds
  its stream open and never answers), or the member's own deadline passing while it waited
  for a leader (UNKNOWN "context deadline exceeded": etcd 3.4 passes a linearizable read's
  or a login's timeout through untranslated during an election): the endpoint cannot be
  reached; the caller fails over and retries (``is_unreachable``);
- anything else: refused (``RendezvousError``).

Invariant: message text is read in exactly one place, ``message_kind``, and only for the
cases where etcd carries the meaning in the message alone.
"""

from __future__ import annotations

import enum

import grpc
import pyetcd.exceptions as etcd_exc

from elastic_run.rendezvous.errors import RendezvousError

__all__ = [
    "EtcdLeaseNotFoundError",
    "MessageKind",
    "find_rpc_error",
    "is_unreachable",
    "message_kind",
    "refusal",
    "status_of",
]

_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_UNREACHABLE_TYPES = (
    etcd_exc.ConnectionFailedError,
    etcd_exc.ConnectionTimeoutError,
    etcd_exc.NoServerAvailableError,
    etcd_exc.WatchTimedOut,
)


class EtcdLeaseNotFoundError(RendezvousError):
    """Etcd no longer knows the lease a request named: it expired or was revoked.

    Every key that was bound to it is gone.
    """


class MessageKind(enum.Enum):
    """What an etcd error message says where its status code alone cannot tell."""

    LOGIN_FAILED = "login failed"
    NO_USER = "no user"
    TLS_HANDSHAKE = "tls handshake"
    SERVER_DEADLINE = "server deadline"
    NO_LEADER = "no leader"


_TLS_MARKERS = ("handshake", "ssl", "certificate", "tls")


def message_kind(details: str) -> MessageKind | None:
    """Read the one meaning an etcd error carries only in its text.

    Why text: etcd sends a wrong password and an empty user name as INVALID_ARGUMENT, the
    code of every malformed request, with the reason only in the message (etcd's own Go
    client maps these messages back to errors the same way). gRPC reports a TLS handshake
    that failed as UNAVAILABLE, the code of an unreachable server, with only the message
    telling them apart. A member whose own deadline passed while it waited for a leader
    (a linearizable read or a login during an election) answers UNKNOWN, the code of any
    untranslated server error, with Go's "context deadline exceeded". A member asked under the
    require-leader flag while it has no leader answers UNAVAILABLE, as an unreachable one does,
    with "etcdserver: no leader" (read by ``leader_watch.member_status``).

    Args:
        details: the status details (the error message) of a failed call.

    Returns:
        The kind of failure, or None when the text says none of these.
    """
    lowered = details.lower()
    if "authentication failed" in lowered:
        return MessageKind.LOGIN_FAILED
    if "user name is empty" in lowered:
        return MessageKind.NO_USER
    if any(marker in lowered for marker in _TLS_MARKERS):
        return MessageKind.TLS_HANDSHAKE
    if "context deadline exceeded" in lowered:
        return MessageKind.SERVER_DEADLINE
    if "etcdserver: no leader" in lowered:
        return MessageKind.NO_LEADER
    return None


def find_rpc_error(exc: BaseException) -> grpc.RpcError | None:
    """Find the gRPC error behind ``exc`` (pyetcd re-raises some inside ``except`` blocks)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if isinstance(seen, grpc.RpcError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def status_of(exc: BaseException) -> tuple[grpc.StatusCode | None, str]:
    """The gRPC status code behind ``exc`` (None when there is none) and a one-line reason."""
    rpc = find_rpc_error(exc)
    code = rpc.code() if rpc is not None and hasattr(rpc, "code") else None
    if rpc is not None and hasattr(rpc, "details"):
        text = " ".join(str(rpc.details() or "").split())
        return code, text or str(code)
    return code, " ".join(str(exc).split()) or type(exc).__name__


def is_unreachable(code: grpc.StatusCode | None, exc: BaseException, reason: str = "") -> bool:
    """Whether a failure means the endpoint could not be reached (fail over and retry).

    Args:
        code: the gRPC status code of the failure (None: not a gRPC error).
        exc: the failure.
        reason: the failure's message (``status_of``), read only for an UNKNOWN code.
    """
    if code == grpc.StatusCode.UNKNOWN:
        return message_kind(reason) is MessageKind.SERVER_DEADLINE
    if code is not None:
        return code in _UNREACHABLE_CODES
    return isinstance(exc, _UNREACHABLE_TYPES)


def refusal(
    code: grpc.StatusCode | None,
    reason: str,
    *,
    endpoint: str,
    what: str,
    user: str | None,
    secure: bool,
    ca_cert: str | None,
) -> RendezvousError | None:
    """The error for a request etcd refused in a way that no retry can fix, else None.

    Args:
        code: the gRPC status code of the failure (None: not a gRPC error).
        reason: the failure's message.
        endpoint: the endpoint that answered, for the message.
        what: what the call was doing (``get 'round'``), for the message.
        user: the etcd user, for the message.
        secure: whether the channel uses TLS.
        ca_cert: the CA certificate file, for the message.

    Returns:
        ``EtcdLeaseNotFoundError`` for NOT_FOUND, a ``RendezvousError`` for rejected
        credentials, permissions or certificates, or None.
    """
    kind = message_kind(reason)
    if code == grpc.StatusCode.NOT_FOUND:
        return EtcdLeaseNotFoundError(f"etcd {endpoint} refused to {what}: {reason}")
    if kind is MessageKind.LOGIN_FAILED:
        return RendezvousError(f"etcd {endpoint} rejected the credentials for user '{user}'")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return RendezvousError(
            f"etcd {endpoint} did not accept the login of user '{user}': {reason}"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return RendezvousError(f"etcd {endpoint} denied user '{user}' access: {reason}")
    if code == grpc.StatusCode.INVALID_ARGUMENT and kind is MessageKind.NO_USER:
        return RendezvousError(
            f"etcd {endpoint} requires a user and password (rdzv-conf user=..., password=...)"
        )
    if secure and code == grpc.StatusCode.UNAVAILABLE and kind is MessageKind.TLS_HANDSHAKE:
        return RendezvousError(
            f"etcd {endpoint}: the TLS handshake failed (is the server certificate "
            f"signed by the CA in '{ca_cert}'?)"
        )
    return None
