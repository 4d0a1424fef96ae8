"""A real Slurm on this host, for end-to-end tests (see /work/shared/SLURM-NOTES.md).

One munged, one slurmctld and one slurmd per node, all started by hand in a private
directory, with a generated slurm.conf on free ports; nothing is written outside it and
nothing needs systemd or cgroups. Nodes are named by loopback addresses (127.0.0.1,
127.0.0.2, ...) so that the job's node list (``127.0.0.[1-2]``) names reachable hosts.

Invariant: :meth:`SlurmCluster.stop` (also run by ``__exit__`` and on a failed start)
leaves no process behind: it cancels the jobs, stops exactly the daemons it started and
kills leftover ``slurmstepd``/task processes by the sessions it knows, never by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil

from tests.helpers import WaitTimeout, wait_until

__all__ = [
    "REQUIRED_PROGRAMS",
    "SlurmCluster",
    "SlurmClusterError",
    "slurm_unavailable_reason",
    "wait_until",
]

# The programs a test Slurm starts or calls -> their Debian packages (scripts/setup.sh).
REQUIRED_PROGRAMS = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    **{name: "slurm-client" for name in ("sbatch", "srun", "sinfo", "squeue", "scancel")},
    "scontrol": "slurm-client",
    "timeout": "coreutils",
}

_CLIENT_TIMEOUT_S = 10.0


class SlurmClusterError(RuntimeError):
    """The test cluster could not start, or a Slurm command did not answer."""


def slurm_unavailable_reason() -> str | None:
    """Say why a real Slurm cannot run here, for a test's failure message.

    Returns:
        None when the binaries are there and the platform can run them; else a sentence.
    """
    if not sys.platform.startswith("linux"):
        return f"a test Slurm needs Linux, not {sys.platform}"
    missing = [name for name in REQUIRED_PROGRAMS if _which(name) is None]
    if missing:
        return (
            f"Slurm/munge binaries missing: {', '.join(missing)} "
            "(apt-get install slurmctld slurmd slurm-client munge)"
        )
    for address in ("127.0.0.1", "127.0.0.2"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((address, 0))
        except OSError as exc:
            return f"cannot bind loopback address {address} for a test node: {exc}"
    return None


def _which(name: str) -> str | None:
    """Find a binary on PATH or in the sbin directories a plain user's PATH may lack."""
    found = shutil.which(name)
    if found is not None:
        return found
    for directory in ("/usr/sbin", "/sbin", "/usr/local/sbin"):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _binary(name: str) -> str:
    path = _which(name)
    if path is None:
        raise SlurmClusterError(f"{name} is not installed")
    return path


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free TCP ports (held open together while picked)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


class SlurmCluster:
    """A Slurm cluster of ``len(nodes)`` nodes on this host, under ``base_dir``.

    Use as a context manager (or call :meth:`start` and :meth:`stop`). Client commands
    need ``SLURM_CONF``: :attr:`env` holds an environment with it, and :meth:`sbatch`,
    :meth:`run_client` use it.
    """

    def __init__(
        self,
        base_dir: Path | str,
        nodes: Sequence[str] = ("127.0.0.1", "127.0.0.2"),
        *,
        cpus_per_node: int = 2,
        start_timeout_s: float = 30.0,
    ) -> None:
        """Prepare (do not start) a cluster.

        Args:
            base_dir: an empty or new private directory for keys, config, state and logs.
            nodes: node names, each a reachable address (loopback addresses here).
            cpus_per_node: CPUs each node announces.
            start_timeout_s: how long start() waits for the nodes to be idle.
        """
        self.base_dir = Path(base_dir).resolve()
        self.nodes = tuple(nodes)
        self.cpus_per_node = cpus_per_node
        self.start_timeout_s = start_timeout_s
        self.conf_path = self.base_dir / "slurm.conf"
        self.jobs_dir = self.base_dir / "jobs"
        self.log_dir = self.base_dir / "log"
        # Unix sockets (munge's, the slurmstepds' in the spool) must fit in 108 bytes, so
        # they live in a short private directory made by start(), not under base_dir.
        self._socket_dir: Path | None = None
        self._munge_dir = self.base_dir / "munge"
        self.munge_socket = self._munge_dir / "munge.sock"
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._sessions: set[int] = set()
        self._submitted: list[subprocess.Popen[bytes]] = []

    # ---- environment -------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The environment for client commands: this process's, without foreign SLURM_*."""
        environ = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))
        }
        environ["SLURM_CONF"] = str(self.conf_path)
        return environ

    def _env_with(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        environ = self.env
        if extra:
            environ.update(extra)
            environ["SLURM_CONF"] = str(self.conf_path)
        return environ

    # ---- start -------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start munged, slurmctld and the slurmds; return once every node is idle.

        Raises:
            SlurmClusterError: a daemon exited or the nodes did not become idle in time
                (the message holds the daemons' log tails); everything started is stopped.
        """
        reason = slurm_unavailable_reason()
        if reason is not None:
            raise SlurmClusterError(reason)
        # The temp folder (a short path: a socket's is at most 107 bytes); the tests' is private.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="slurm-"))
        self._munge_dir = self._socket_dir / "munge"
        self.munge_socket = self._munge_dir / "munge.sock"
        for directory in (self._munge_dir, self.jobs_dir, self.log_dir, self.base_dir / "state"):
            directory.mkdir(parents=True, exist_ok=True)
        self._munge_dir.chmod(0o700)
        for node in self.nodes:
            (self._spool_dir / node).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._write_conf()
            self._spawn(
                "slurmctld", [_binary("slurmctld"), "-D", "-f", str(self.conf_path)], "slurmctld"
            )
            for node in self.nodes:
                self._spawn(
                    f"slurmd {node}",
                    [_binary("slurmd"), "-D", "-N", node, "-f", str(self.conf_path)],
                    f"slurmd-{node}.out",
                )
            self._wait_idle()
        except BaseException as exc:
            logs = self.log_tails()
            self.stop()
            if isinstance(exc, (SlurmClusterError, WaitTimeout, TimeoutError, OSError)):
                raise SlurmClusterError(f"test Slurm did not start: {exc}\n{logs}") from exc
            raise

    def _start_munge(self) -> None:
        key = self._munge_dir / "munge.key"
        subprocess.run(
            [_binary("mungekey"), "--create", f"--keyfile={key}"],
            check=True,
            capture_output=True,
            timeout=_CLIENT_TIMEOUT_S,
        )
        self._spawn(
            "munged",
            [
                _binary("munged"),
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self._munge_dir / 'munged.pid'}",
                f"--seed-file={self._munge_dir / 'munged.seed'}",
                f"--log-file={self.log_dir / 'munged.log'}",
            ],
            "munged.out",
        )
        wait_until(self.munge_socket.exists, 10.0, "the munge socket")

    def _write_conf(self) -> None:
        ports = _free_ports(1 + len(self.nodes))
        user = psutil.Process().username()
        base = self.base_dir
        lines = [
            f"ClusterName=elastictest{os.getpid()}",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={ports[0]}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={base / 'state'}",
            f"SlurmdSpoolDir={self._spool_dir}/%n",
            f"SlurmctldPidFile={base / 'slurmctld.pid'}",
            f"SlurmdPidFile={base / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            # Fast and finite tests: sbatch --wait polls at 2, 8, 32 s without MinJobAge,
            # and an impossible request would pend forever without EnforcePartLimits.
            "MinJobAge=5",
            "KillWait=2",
            "EnforcePartLimits=ALL",
        ]
        for node, port in zip(self.nodes, ports[1:], strict=True):
            lines.append(
                f"NodeName={node} NodeAddr={node} Port={port} CPUs={self.cpus_per_node} "
                f"Sockets=1 CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 "
                "RealMemory=1000"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf_path.write_text("\n".join(lines) + "\n")

    @property
    def _spool_dir(self) -> Path:
        assert self._socket_dir is not None, "start() makes the socket directory"
        return self._socket_dir / "spool"

    def _spawn(self, name: str, argv: list[str], log_name: str) -> None:
        log_path = self.log_dir / log_name
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.base_dir,
                start_new_session=True,
            )
        self._daemons.append((name, process))
        self._sessions.add(process.pid)

    def _check_daemons(self) -> None:
        for name, process in self._daemons:
            code = process.poll()
            if code is not None:
                raise SlurmClusterError(f"{name} exited with code {code}")

    def _wait_idle(self) -> None:
        expected = f"idle {len(self.nodes)}"

        def all_idle() -> bool:
            self._check_daemons()
            result = self.run_client(["sinfo", "-h", "-o", "%T %D"], check=False)
            return result.returncode == 0 and result.stdout.strip() == expected

        wait_until(all_idle, self.start_timeout_s, f"sinfo to say {expected!r}")

    # ---- client commands -----------------------------------------------------------

    def run_client(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout_s: float = _CLIENT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sinfo, squeue, scontrol...) against this cluster.

        Wrapped in ``timeout``: client commands hang once the daemons are gone.

        Args:
            argv: the command, e.g. ``["squeue", "-h"]``.
            check: raise when it fails.
            timeout_s: how long it may take.
            env: extra environment variables.

        Returns:
            The completed process, with text stdout/stderr.

        Raises:
            SlurmClusterError: ``check`` and the command failed or timed out.
        """
        command = [
            _binary("timeout"),
            "-k",
            "2",
            str(timeout_s),
            _binary(argv[0]),
            *argv[1:],
        ]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=self._env_with(env),
            timeout=timeout_s + 5,
            check=False,
        )
        if check and result.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(argv)} exited with {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def output_path(self, job_id: str) -> Path:
        """Return where a job's batch output goes (``jobs/slurm-<id>.out``)."""
        return self.jobs_dir / f"slurm-{job_id}.out"

    def output_of(self, job_id: str) -> str:
        """Return the batch output of a job (stdout and stderr), or "" if none yet."""
        path = self.output_path(job_id)
        return path.read_text(errors="replace") if path.exists() else ""

    def sbatch(
        self,
        script: Path | str,
        *script_args: str,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        options: Iterable[str] = (),
        cwd: Path | str | None = None,
        timeout_s: float = 90.0,
    ) -> tuple[int | None, str]:
        """Submit a batch script; with ``wait``, return once the job ended.

        Output goes to :meth:`output_path` (``--output`` overrides the script's own).

        Args:
            script: path of the batch script.
            *script_args: arguments for the script.
            wait: pass ``--wait`` and wait for the job to end.
            env: extra environment for the job (exported with ``--export=ALL``).
            options: more sbatch options, before the script (``["-N2"]``).
            cwd: the submit (and working) directory; default the cluster's jobs dir.
            timeout_s: how long a waited job may take before it is cancelled.

        Returns:
            ``(exit_code, job_id)``: the job's exit code from ``sbatch --wait``, or None
            without ``wait``.

        Raises:
            SlurmClusterError: sbatch failed, or the job outlived ``timeout_s`` (it is
                cancelled first; the message holds its output).
        """
        stamp = len(self._submitted)
        out_path = self.base_dir / f"sbatch-{stamp}.out"
        err_path = self.base_dir / f"sbatch-{stamp}.err"
        argv = [
            _binary("sbatch"),
            "--parsable",
            f"--output={self.jobs_dir / 'slurm-%j.out'}",
            *options,
            *(["--wait"] if wait else []),
            str(Path(script).resolve()),
            *script_args,
        ]
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=self._env_with(env),
                cwd=str(cwd) if cwd is not None else str(self.jobs_dir),
                start_new_session=True,
            )
        self._submitted.append(process)

        def job_id_or_exit() -> bool:
            return bool(out_path.read_text().strip()) or process.poll() is not None

        wait_until(job_id_or_exit, _CLIENT_TIMEOUT_S * 3, "sbatch to print the job id")
        job_id = out_path.read_text().strip().split(";")[0]
        if not job_id:
            process.wait(timeout=_CLIENT_TIMEOUT_S)
            raise SlurmClusterError(
                f"sbatch {script} failed ({process.returncode}): {err_path.read_text().strip()}"
            )
        if not wait:
            process.wait(timeout=_CLIENT_TIMEOUT_S)
            return None, job_id
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.run_client(["scancel", job_id], check=False)
            process.wait(timeout=_CLIENT_TIMEOUT_S * 3)
            raise SlurmClusterError(
                f"job {job_id} ran past {timeout_s} s and was cancelled; output:\n"
                f"{self.output_of(job_id)}"
            ) from exc
        return code, job_id

    def daemon_pids(self) -> list[int]:
        """Return the pids of the daemons this cluster started (munged, slurmctld, slurmds)."""
        return [process.pid for _name, process in self._daemons]

    def job_ids(self) -> list[str]:
        """Return the ids of the jobs squeue lists (pending or running)."""
        result = self.run_client(["squeue", "-h", "-o", "%i"], check=False)
        if result.returncode != 0:
            raise SlurmClusterError(f"squeue failed: {result.stderr.strip()}")
        return result.stdout.split()

    def log_tails(self, lines: int = 20) -> str:
        """Return the last lines of every daemon log, for a failing test's report."""
        parts: list[str] = []
        if self.log_dir.exists():
            for path in sorted(self.log_dir.iterdir()):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)

    # ---- stop --------------------------------------------------------------------

    def stop(self, timeout_s: float = 15.0) -> None:
        """Cancel every job, stop the daemons started here, kill whatever they left.

        Safe to call twice and after a failed start.

        Args:
            timeout_s: how long to wait for the queue to drain and for each daemon.
        """
        if not self._daemons:
            self._remove_socket_dir()
            return
        controller_up = any(
            name == "slurmctld" and process.poll() is None for name, process in self._daemons
        )
        if controller_up:
            self._cancel_all(timeout_s)
        # The steps' slurmstepd daemonize out of slurmd's tree, but keep its session.
        leftovers = self._session_members()
        for _name, process in reversed(self._daemons):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _name, process in reversed(self._daemons):
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)
        leftovers.extend(self._session_members())
        self._kill_all(leftovers)
        for process in self._submitted:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=timeout_s)
        self._daemons.clear()
        self._submitted.clear()
        self._remove_socket_dir()

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def _cancel_all(self, timeout_s: float) -> None:
        try:
            ids = self.job_ids()
            if ids:
                self.run_client(["scancel", *ids], check=False)

            def queue_empty() -> bool:
                return not self.job_ids()

            wait_until(queue_empty, timeout_s, "squeue to be empty")
        except (SlurmClusterError, WaitTimeout, subprocess.TimeoutExpired):
            # The daemons are stopped next regardless; leftovers are killed by session.
            pass

    def _session_members(self) -> list[psutil.Process]:
        """Every live process of this cluster, and their children.

        That is the processes in a session one of our daemons leads, and those that carry
        this cluster's SLURM_CONF in their environment: a slurmstepd calls setsid and
        leaves slurmd's tree, but inherits slurmd's environment (and a job's tasks, the
        submitter's), so the config path names them exactly, without matching by name.
        """
        members: dict[int, psutil.Process] = {}
        own = {os.getpid(), *(parent.pid for parent in psutil.Process().parents())}
        for process in psutil.process_iter():
            if process.pid in own:
                continue
            if _session_of(process.pid) in self._sessions or self._carries_conf(process):
                members[process.pid] = process
                try:
                    for child in process.children(recursive=True):
                        members[child.pid] = child
                except psutil.Error:
                    continue
        return list(members.values())

    def _carries_conf(self, process: psutil.Process) -> bool:
        try:
            return process.environ().get("SLURM_CONF") == str(self.conf_path)
        except psutil.Error:
            return False

    def _kill_all(self, processes: Iterable[psutil.Process]) -> None:
        alive: list[psutil.Process] = []
        for process in processes:
            try:
                if process.is_running():
                    process.kill()
                    alive.append(process)
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=10)
