"""EtcdServer: a local etcd (one member or a small cluster) for tests, demos and ``elastic-run etcd``.

Invariants: every member listens on free ports of ``host`` (loopback by default);
``start()`` returns only once every member answers a real request; ``stop()`` ends
every process it started (SIGTERM, then SIGKILL) and removes a temporary data
directory. Each member's output goes to a log file (``log_paths``, ``read_logs()``).
A temporary data directory (``$TMPDIR/elastic-run-etcd-*``) is an owned folder
(:mod:`elastic_run.rendezvous.owned_dir`): held locked by the process that made the server, so that if
that process is SIGKILLed (its members die with it: parent-death signal) the next server made
on the host, or the next ``elastic-run``, removes it.

torch's ``EtcdServer`` API is here too: ``EtcdServer(data_dir=None)``, ``start(timeout=60,
num_retries=3, stderr=None)`` (a start that fails is retried on fresh ports and a fresh data
directory; one that never becomes healthy raises :class:`EtcdServerTimeoutError`, a
``TimeoutError``), ``stop()``, ``get_host()``, ``get_port()``, ``get_endpoint()``, and
``get_client()``, which returns our etcd v3 client (torch's returns a python-etcd v2 one).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from elastic_run.errors import ConfigurationError
from elastic_run.parent_death import death_signal_prefix, set_parent_death_signal
from elastic_run.rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
)
from elastic_run.rendezvous.etcd.client import EtcdClient
from elastic_run.rendezvous.owned_dir import ETCD_PREFIX, OwnedDir, reclaim_orphans

__all__ = [
    "EtcdServer",
    "EtcdServerTLS",
    "EtcdServerTimeoutError",
    "find_etcd_binary",
    "main_foreground",
]

log = logging.getLogger(__name__)


class EtcdServerTimeoutError(RendezvousTimeoutError, TimeoutError):
    """An etcd member did not become healthy in time (torch's ``start`` raises TimeoutError)."""


_BINARY_VARIABLES = ("ELASTIC_RUN_ETCD_BINARY", "TORCHELASTIC_ETCD_BINARY_PATH")


def find_etcd_binary(binary: str | None = None) -> str:
    """Return the etcd executable: ``binary``, else the environment variables, else PATH.

    Raises:
        ConfigurationError: when no etcd executable can be found.
    """
    candidates = [binary] if binary else [os.environ.get(v) for v in _BINARY_VARIABLES]
    for candidate in candidates:
        if candidate:
            found = shutil.which(candidate)
            if found is None:
                raise ConfigurationError(f"the etcd binary '{candidate}' does not exist")
            return found
    found = shutil.which("etcd")
    if found is None:
        raise ConfigurationError(
            "etcd is not installed: put 'etcd' on PATH or set ELASTIC_RUN_ETCD_BINARY"
        )
    return found


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class EtcdServerTLS:
    """TLS for the client URLs: the server's certificate and key (PEM paths)."""

    cert_file: str
    key_file: str
    ca_file: str | None = None


@dataclass
class _Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None


class EtcdServer:
    """One etcd member or a cluster of ``members``, on free local ports.

    Args:
        data_dir: where the members keep their data and logs; a temporary directory
            (removed by ``stop()``) when None.
        members: the number of members (1, or 3 or 5 for a cluster).
        binary: the etcd executable (default: ELASTIC_RUN_ETCD_BINARY,
            TORCHELASTIC_ETCD_BINARY_PATH, then ``etcd`` on PATH).
        host: the address to listen on.
        port: the client port of the first member (0: a free one).
        tls: serve the client URLs over TLS with this certificate.
        extra_args: more etcd flags for every member.

    Raises:
        ConfigurationError: when etcd cannot be found or ``members`` is below 1.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        members: int = 1,
        binary: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: EtcdServerTLS | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if members < 1:
            raise ConfigurationError(f"an etcd cluster needs at least 1 member, got {members}")
        self._binary = find_etcd_binary(binary)
        self._host = host
        self._tls = tls
        self._extra_args = extra_args
        self._owns_dir = data_dir is None
        self._owned: OwnedDir | None = None
        if data_dir is None:
            reclaim_orphans()  # the folders of members whose owners were SIGKILLed
            try:
                self._owned = OwnedDir.create(ETCD_PREFIX)
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot make etcd's data folder in {tempfile.gettempdir()}: "
                    f"{exc.strerror or exc}"
                ) from exc
            self._root = self._owned.path
        else:
            self._root = Path(data_dir)
        self._root.mkdir(parents=True, exist_ok=True)
        self._fixed_port = port
        self._members: list[_Member] = []
        for i in range(members):
            client_port = port if (i == 0 and port) else _free_port(host)
            self._members.append(
                _Member(
                    name=f"member{i}",
                    client_port=client_port,
                    peer_port=_free_port(host),
                    data_dir=self._root / f"member{i}.etcd",
                    log_path=self._root / f"member{i}.log",
                )
            )
        self._started = False

    @property
    def endpoint(self) -> str:
        """The first member's client address (``host:port``)."""
        return self.endpoints[0]

    @property
    def endpoints(self) -> list[str]:
        """Every member's client address."""
        return [f"{self._host}:{m.client_port}" for m in self._members]

    @property
    def log_paths(self) -> list[Path]:
        """The members' log files."""
        return [m.log_path for m in self._members]

    @property
    def data_dir(self) -> Path:
        """The directory holding the members' data and logs."""
        return self._root

    def read_logs(self, tail_chars: int = 20_000) -> str:
        """Return the end of every member's log, for a failing test's report."""
        parts = []
        for m in self._members:
            text = m.log_path.read_text(errors="replace") if m.log_path.exists() else ""
            parts.append(f"==== etcd {m.name} ({m.log_path}) ====\n{text[-tail_chars:]}")
        return "\n".join(parts)

    def _scheme(self) -> str:
        return "https" if self._tls else "http"

    def _command(self, m: _Member) -> list[str]:
        cluster = ",".join(f"{x.name}=http://{self._host}:{x.peer_port}" for x in self._members)
        client_url = f"{self._scheme()}://{self._host}:{m.client_port}"
        args = [
            self._binary,
            "--name",
            m.name,
            "--data-dir",
            str(m.data_dir),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            f"http://{self._host}:{m.peer_port}",
            "--initial-advertise-peer-urls",
            f"http://{self._host}:{m.peer_port}",
            "--initial-cluster",
            cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"elastic-run-{self._root.name}",
            "--enable-v2=false",
        ]
        if self._tls:
            args += ["--cert-file", self._tls.cert_file, "--key-file", self._tls.key_file]
            if self._tls.ca_file:
                args += ["--trusted-ca-file", self._tls.ca_file]
        return args + list(self._extra_args)

    def _spawn(self, m: _Member, stderr: int | IO[Any] | None = None) -> None:
        m.log_file = open(m.log_path, "ab")
        prefix = death_signal_prefix()
        m.process = subprocess.Popen(
            [*prefix, *self._command(m)],
            stdin=subprocess.DEVNULL,
            stdout=m.log_file,
            stderr=subprocess.STDOUT if stderr is None else stderr,
            preexec_fn=None if prefix else set_parent_death_signal,
        )

    def start(
        self,
        timeout: float = 60,
        num_retries: int = 3,
        stderr: int | IO[Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """Start every member and return once each answers a real request (torch's ``start``).

        Args:
            timeout: seconds each try may take until every member is healthy.
            num_retries: how many tries in all; each retry takes fresh ports (unless a port
                was given) and a fresh data directory.
            stderr: where the members' stderr goes (default: their log files).
            timeout_s: the same as ``timeout`` (ours; wins when given).

        Raises:
            EtcdServerTimeoutError: a member did not answer in time on the last try (also a
                ``TimeoutError``); the message ends with the members' logs.
            RendezvousError: a member exited at start on the last try.
        """
        if self._started:
            return
        wait_s = float(timeout if timeout_s is None else timeout_s)
        tries = max(1, int(num_retries))
        for attempt in range(tries):
            self._started = True
            try:
                if attempt:
                    self._fresh_start(attempt)
                for m in self._members:
                    self._spawn(m, stderr)
                deadline = time.monotonic() + wait_s
                for i in range(len(self._members)):
                    self._wait_healthy(i, deadline)
                return
            except RendezvousError as exc:
                if attempt + 1 == tries:
                    self.stop()
                    raise
                log.warning("etcd did not start (try %d of %d): %s", attempt + 1, tries, exc)
                self._stop_members(signal.SIGKILL)
            except BaseException:
                self.stop()
                raise

    def _fresh_start(self, attempt: int) -> None:
        for i, m in enumerate(self._members):
            if not (i == 0 and self._fixed_port):
                m.client_port = _free_port(self._host)
            m.peer_port = _free_port(self._host)
            m.data_dir = self._root / f"try{attempt}" / f"member{i}.etcd"

    def get_host(self) -> str:
        """The host the members listen on (torch's ``get_host``)."""
        return self._host

    def get_port(self) -> int:
        """The first member's client port (torch's ``get_port``)."""
        return self._members[0].client_port

    def get_endpoint(self) -> str:
        """The first member's client address, ``host:port`` (torch's ``get_endpoint``)."""
        return self.endpoint

    def _member_client(self, i: int) -> EtcdClient:
        ca = self._tls.ca_file if self._tls else None
        return EtcdClient(
            [self.endpoints[i]],
            protocol=self._scheme(),
            ca_cert=ca,
            timeout_s=2.0,
            retry_window_s=0.0,
        )

    def _wait_healthy(self, i: int, deadline: float) -> None:
        m = self._members[i]
        client = self._member_client(i)
        pause = threading.Event()
        try:
            while True:
                if m.process is not None and m.process.poll() is not None:
                    raise RendezvousError(
                        f"etcd {m.name} exited with code {m.process.returncode} at start:\n"
                        + self.read_logs(4000)
                    )
                try:
                    client.status_revision()
                    return
                except RendezvousConnectionError as exc:
                    if time.monotonic() >= deadline:
                        raise EtcdServerTimeoutError(
                            f"etcd {m.name} at {self.endpoints[i]} did not become healthy: "
                            f"{exc}\n" + self.read_logs(4000)
                        ) from exc
                except RendezvousError:
                    return  # it answered (e.g. auth is on): it is up
                pause.wait(0.05)
        finally:
            client.close()

    def _stop_member(self, m: _Member, sig: int) -> None:
        proc = m.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        m.process = None
        if m.log_file is not None:
            m.log_file.close()
            m.log_file = None

    def kill_member(self, i: int) -> None:
        """SIGKILL member ``i`` (its data stays for ``restart_member``)."""
        self._stop_member(self._members[i], signal.SIGKILL)

    def restart_member(self, i: int, timeout_s: float = 30.0) -> None:
        """Start member ``i`` again on its ports and data, stopping it first if running.

        Raises:
            RendezvousError: when it does not answer within ``timeout_s``.
        """
        m = self._members[i]
        self._stop_member(m, signal.SIGTERM)
        self._spawn(m)
        self._wait_healthy(i, time.monotonic() + timeout_s)

    def member_pid(self, i: int) -> int | None:
        """Return the process id of member ``i`` (None when it is not running)."""
        proc = self._members[i].process
        return proc.pid if proc is not None and proc.poll() is None else None

    def is_member_running(self, i: int) -> bool:
        """Return whether member ``i``'s process is alive."""
        proc = self._members[i].process
        return proc is not None and proc.poll() is None

    def get_client(self, **kwargs: Any) -> EtcdClient:
        """Return an ``EtcdClient`` on every member's endpoint (kwargs go to it)."""
        if self._tls and "ca_cert" not in kwargs:
            kwargs["ca_cert"] = self._tls.ca_file
            kwargs.setdefault("protocol", "https")
        return EtcdClient(self.endpoints, **kwargs)

    def stop(self) -> None:
        """Stop every member and remove a temporary data directory. Idempotent."""
        # Data in a temporary directory is thrown away: no need for a graceful stop
        # (which, in a cluster stopping as a whole, waits on leader transfer).
        self._stop_members(signal.SIGKILL if self._owns_dir else signal.SIGTERM)
        if self._owned is not None:
            self._owned.remove()
        self._started = False

    def _stop_members(self, sig: int) -> None:
        for m in self._members:  # signal all first: members stop in parallel
            if m.process is not None and m.process.poll() is None:
                m.process.send_signal(sig)
        for m in self._members:
            self._stop_member(m, sig)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main_foreground(
    data_dir: str | None = None,
    port: int = 0,
    host: str = "127.0.0.1",
    members: int = 1,
    out: IO[str] | None = None,
) -> int:
    """Run an etcd until SIGINT/SIGTERM (SIGUSR1/2 ignored), printing the endpoint to pass.

    Args:
        data_dir: where to keep data and logs (temporary, removed at exit, when None).
        port: the first member's client port (0: a free one).
        host: the address to listen on.
        members: how many members to run.
        out: where to print (stdout by default).

    Returns:
        The exit code: 0 after a clean stop.

    Raises:
        ConfigurationError: when etcd cannot be found.
        RendezvousError: when etcd does not start.
    """
    stream = out if out is not None else sys.stdout
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    # A Slurm preemption notice (--signal=USR1@60, scancel --signal) reaches every process of
    # the job's steps, this one too: it is meant for the workers, and must not end the store.
    for s in (signal.SIGUSR1, signal.SIGUSR2):
        previous[s] = signal.signal(s, signal.SIG_IGN)
    server = EtcdServer(data_dir, members=members, host=host, port=port)
    try:
        server.start()
        endpoints = ",".join(server.endpoints)
        print(f"etcd is ready ({members} member(s), logs in {server.data_dir})", file=stream)
        print(f"--rdzv-backend etcd --rdzv-endpoint {endpoints}", file=stream, flush=True)
        while not stop.wait(0.5):
            for i in range(members):
                if not server.is_member_running(i):
                    print(f"etcd member {i} exited; stopping", file=stream, flush=True)
                    return 1
        return 0
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
