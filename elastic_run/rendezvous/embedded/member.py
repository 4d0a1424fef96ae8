"""EmbeddedMember: this host's etcd member of the job's static cluster, run through its keeper.

The member lives in a temporary directory (``$TMPDIR/elastic-run-etcd-<run id>-*``: ``data/``
and ``member.log``) and runs under the keeper (``keeper.py``), which this agent alone feeds
through a pipe: when the agent stops it, exits or is SIGKILLed, the keeper stops etcd and removes
the directory. So a member never outlives its agent, and leaves no file behind. Should the keeper
die too (every process of the host SIGKILLed), the directory is an owned folder
(:mod:`elastic_run.rendezvous.owned_dir`, its lock held by the agent and the keeper): the next member or
``elastic-run`` started on the host removes it.

Ports: the client port listed (default 29410) and the peer port, client + 1, both bound on the
one address the agent is reached at (never all interfaces). TLS: when the ``--rdzv-conf`` keys of
the etcd backend give a certificate and its key (``ssl_cert``, ``ssl_cert_key``), the member
serves its clients and its peers over TLS with them (``ca_cert``: the CA that signed the other
members' and the agents' certificates, required of every client and peer then).

Invariants: ``start()`` raises ``ConfigurationError`` naming what to install when etcd is
missing, before anything starts; ``stop()`` returns once etcd is gone and the directory removed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.embedded import keeper
from elastic_run.rendezvous.embedded.cluster import EmbeddedCluster, MemberSpec
from elastic_run.rendezvous.errors import RendezvousConnectionError
from elastic_run.rendezvous.etcd.server import find_etcd_binary
from elastic_run.rendezvous.owned_dir import ETCD_PREFIX, OwnedDir, reclaim_orphans
from elastic_run.rendezvous.settings import DEFAULT_ELECTION_TIMEOUT_S

__all__ = [
    "ELECTION_TIMEOUT_RANGE_S",
    "EmbeddedMember",
    "MemberTLS",
    "find_member_binary",
]

_STOP_WAIT_S = 15.0
# The bounds of the members' election timeout: a beat (a tenth of it) of at least 5 ms, and
# etcd's own limit (it refuses a timeout over 50 s).
ELECTION_TIMEOUT_RANGE_S = (0.05, 50.0)


@dataclass(frozen=True)
class MemberTLS:
    """The member's certificate and key (PEM paths), and the CA its clients and peers need."""

    cert_file: str
    key_file: str
    ca_file: str | None = None


def find_member_binary(member: MemberSpec, binary: str | None = None) -> str:
    """The etcd executable this host's member runs.

    Raises:
        ConfigurationError: none is installed, in one line that says what to install.
    """
    try:
        return find_etcd_binary(binary)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"this host runs the embedded etcd member {member.name} ({member.client_endpoint}), "
            f"but {exc}: install Debian's etcd-server package (apt-get install etcd-server)"
        ) from None


def _url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class EmbeddedMember:
    """This host's member: started by ``start()``, stopped by ``stop()`` or with the agent.

    Args:
        cluster: the job's cluster.
        spec: this host's member in it.
        bind_addr: the one address it listens on.
        run_id: the job's id (names the temporary directory).
        tls: serve clients and peers over TLS with this certificate.
        binary: the etcd executable (default: ``find_etcd_binary``'s search).
        election_timeout_s: the members' raft election timeout (``--rdzv-conf
            election_timeout``); they beat every tenth of it.

    Raises:
        ConfigurationError: etcd is not installed (see :func:`find_member_binary`), or the
            election timeout is outside ``ELECTION_TIMEOUT_RANGE_S``.
    """

    def __init__(
        self,
        cluster: EmbeddedCluster,
        spec: MemberSpec,
        bind_addr: str,
        run_id: str,
        *,
        tls: MemberTLS | None = None,
        binary: str | None = None,
        election_timeout_s: float = DEFAULT_ELECTION_TIMEOUT_S,
    ) -> None:
        low, high = ELECTION_TIMEOUT_RANGE_S
        if not low <= election_timeout_s <= high:
            raise ConfigurationError(
                f"--rdzv-conf election_timeout {election_timeout_s:g} is out of range "
                f"({low:g}..{high:g} s) for the embedded etcd members"
            )
        self._election_ms = round(election_timeout_s * 1000)
        self._cluster = cluster
        self._spec = spec
        self._bind = bind_addr
        self._run_id = run_id
        self._tls = tls
        self._binary = find_member_binary(spec, binary)
        self._root: Path | None = None
        self._owned: OwnedDir | None = None
        self._keeper: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def spec(self) -> MemberSpec:
        """Which member this is."""
        return self._spec

    @property
    def root(self) -> Path | None:
        """The temporary directory (data and log), None before ``start()``."""
        return self._root

    @property
    def keeper_pid(self) -> int | None:
        """The keeper's process id, None before ``start()``."""
        return self._keeper.pid if self._keeper is not None else None

    def command(self, data_dir: Path) -> list[str]:
        """The etcd command line of this member."""
        scheme = "https" if self._tls else "http"
        spec = self._spec
        args = [
            self._binary,
            "--name", spec.name,
            "--data-dir", str(data_dir),
            "--listen-client-urls", _url(scheme, self._bind, spec.client_port),
            "--advertise-client-urls", spec.url(scheme, spec.client_port),
            "--listen-peer-urls", _url(scheme, self._bind, spec.peer_port),
            "--initial-advertise-peer-urls", spec.url(scheme, spec.peer_port),
            "--initial-cluster", self._cluster.initial_cluster(scheme),
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self._cluster.token,
            "--enable-v2=false",
            # A member cut off must not depose the leader with its inflated term at the heal.
            "--pre-vote",
            # A leader whose host died is replaced within one or two election timeouts (etcd
            # waits a random [timeout, 2 x timeout) before it campaigns): etcd's defaults (100
            # and 1,000 ms) took 1.0 to 2.0 s of every host loss that hit the leader. The
            # members are the job's own hosts, one network away: by default 50 ms beats and a
            # 500 ms timeout (``election_timeout``; etcd wants at least 5 beats a timeout).
            "--heartbeat-interval", str(max(1, self._election_ms // 10)),
            "--election-timeout", str(self._election_ms),
            # Heartbeat keys are rewritten every second by every node: keep one hour of history.
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", "1h",
        ]  # fmt: skip
        tls = self._tls
        if tls is not None:
            args += ["--cert-file", tls.cert_file, "--key-file", tls.key_file]
            args += ["--peer-cert-file", tls.cert_file, "--peer-key-file", tls.key_file]
            if tls.ca_file:
                args += ["--trusted-ca-file", tls.ca_file, "--client-cert-auth"]
                args += ["--peer-trusted-ca-file", tls.ca_file, "--peer-client-cert-auth"]
        return args

    def start(self) -> None:
        """Start the keeper and, under it, etcd; return at once (the cluster forms later).

        Raises:
            RendezvousConnectionError: the keeper could not be started.
        """
        if self._keeper is not None:
            return
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self._run_id)[:40]
        reclaim_orphans()  # the folders of members whose hosts' processes were all SIGKILLed
        try:
            self._owned = OwnedDir.create(f"{ETCD_PREFIX}{safe}-")
            self._root = self._owned.path
            self._log = open(self._root / "member.log", "ab")
        except OSError as exc:
            self._cleanup()
            raise RendezvousConnectionError(
                f"cannot make the embedded etcd member's data folder in "
                f"{tempfile.gettempdir()}: {exc.strerror or exc}"
            ) from exc
        argv = [
            sys.executable, "-I", "-S", keeper.__file__, str(self._root), "--",
            *self.command(self._root / "data"),
        ]  # fmt: skip
        try:
            self._keeper = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=(self._owned.fd,),  # the keeper holds the folder's lock too
            )
        except OSError as exc:
            self._cleanup()
            raise RendezvousConnectionError(
                f"could not start the embedded etcd member {self._spec.name}: {exc}"
            ) from exc

    def is_running(self) -> bool:
        """Whether etcd runs under the keeper (a process, answering or not)."""
        proc = self._keeper
        if proc is None or proc.poll() is not None or self._root is None:
            return False
        return not (self._root / keeper.EXITED_FILE).exists()

    def exit_reason(self) -> str:
        """Why the member exited, from its log, or ``""``.

        etcd's last critical or error line (``C |``/``E |``, or a zap ``fatal``/``error`` level)
        names the cause (``listen tcp ...: bind: address already in use``), without its time
        stamp; else the log's last line (the keeper's ``etcd exited with status N``).
        """
        root = self._root
        if root is None:
            return ""
        try:
            text = (root / "member.log").read_text(errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        for line in reversed(lines):
            for mark in (" C | ", " E | "):
                if mark in line:
                    return line.partition(mark)[2][:300]
            if '"level":"fatal"' in line or '"level":"error"' in line:
                return line[:300]
        return lines[-1][:300] if lines else ""

    def stop(self, graceful: bool = False) -> None:
        """Stop etcd and remove its directory; return once both are gone. Idempotent.

        Args:
            graceful: SIGTERM (a leader hands over first) instead of SIGKILL, for a member
                that leaves a cluster that goes on.
        """
        proc = self._keeper
        if proc is not None and proc.stdin is not None:
            try:
                if graceful:
                    proc.stdin.write(b"term\n")
                proc.stdin.close()
            except OSError:
                pass  # the keeper is gone already: it cleaned up on its way out
            try:
                proc.wait(timeout=_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_STOP_WAIT_S)
        self._keeper = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._owned is not None:
            self._owned.remove()
            self._owned = None
        self._root = None
