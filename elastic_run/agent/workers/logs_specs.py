"""Where workers' logs go: torch's ``LogsSpecs`` / ``DefaultLogsSpecs`` / ``LogsDest``, call for call.

A ``LogsSpecs`` turns each attempt's worker environments into destinations (``reify``). The
default layout is torch's::

    <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}

``<run_id>_<random>`` is made once per ``DefaultLogsSpecs`` (per agent), so a second run with
the same run id, or a second agent on the same host, never overwrites the first one's logs.
``<n>`` is the agent's attempt (every start of its workers, restarts and re-rendezvous alike;
torchrun uses the restart count, which a re-rendezvous does not change, so torchrun overwrites
those logs). Without ``log_dir`` a fresh temporary directory is the base.

stdout.log/stderr.log exist only for redirected or teed streams, as in torch.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_run.agent.config import Std
from elastic_run.errors import ConfigurationError

__all__ = [
    "ATTEMPT_ENV",
    "DefaultLogsSpecs",
    "LogDirNotADirectoryError",
    "LogsDest",
    "LogsSpecs",
    "Std",
    "TorchLogsSpecs",
]

# Passed to ``reify`` (never to a worker): the agent's attempt number for the directory name.
ATTEMPT_ENV = "ELASTIC_RUN_ATTEMPT"


class LogDirNotADirectoryError(ConfigurationError, NotADirectoryError):
    """``log_dir`` exists and is not a directory.

    A ``NotADirectoryError``, as torch's ``DefaultLogsSpecs`` raises, and a
    ``ConfigurationError`` (a ``ValueError``), as bad user input is here.
    """


@dataclass
class LogsDest:
    """Where each local rank's streams and error file go (paths; "" for none).

    Attributes mirror torch's: ``stdouts``/``stderrs`` (file of each stream), ``tee_stdouts``/
    ``tee_stderrs`` (the ranks whose stream also goes to the console), ``error_files``,
    ``filtered_stdout``/``filtered_stderr`` (the file of the duplicated, filtered lines).
    """

    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)
    tee_stdouts: dict[int, str] = field(default_factory=dict)
    tee_stderrs: dict[int, str] = field(default_factory=dict)
    error_files: dict[int, str] = field(default_factory=dict)
    filtered_stdout: str = ""
    filtered_stderr: str = ""


def _per_rank(value: Std | Mapping[int, Std], local_rank: int) -> Std:
    if isinstance(value, Std):
        return value
    return value.get(local_rank, Std.NONE)


class LogsSpecs(ABC):
    """Where an agent writes its workers' logs (torch's interface).

    Args:
        log_dir: the base directory (None: a temporary one).
        redirects: streams that go to files only, for all ranks or per local rank.
        tee: streams that go to files and the console, for all ranks or per local rank.
        local_ranks_filter: the local ranks shown on the console (None: all).

    Raises:
        LogDirNotADirectoryError: ``log_dir`` exists and is not a directory (a
            ``NotADirectoryError`` and a ``ValueError``).
    """

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: Std | dict[int, Std] = Std.NONE,
        tee: Std | dict[int, Std] = Std.NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        if log_dir is not None and os.path.exists(log_dir) and not os.path.isdir(log_dir):
            raise LogDirNotADirectoryError(f"log_dir: {log_dir} is not a directory")
        self._root_log_dir = log_dir
        self._redirects = redirects
        self._tee = tee
        self._local_ranks_filter = local_ranks_filter

    @abstractmethod
    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """The destinations of one attempt, from each local rank's environment."""

    @property
    @abstractmethod
    def root_log_dir(self) -> str:
        """The directory every log of this agent lives under."""

    def redirect_for(self, local_rank: int) -> Std:
        """The streams of ``local_rank`` that go to files only."""
        return _per_rank(self._redirects, local_rank)

    def tee_for(self, local_rank: int) -> Std:
        """The streams of ``local_rank`` that go to files and the console."""
        return _per_rank(self._tee, local_rank)

    def shows_on_console(self, local_rank: int) -> bool:
        """Whether ``local_rank``'s output reaches the console (``--local-ranks-filter``)."""
        return self._local_ranks_filter is None or local_rank in self._local_ranks_filter


class DefaultLogsSpecs(LogsSpecs):
    """torch's default layout (see the module docstring)."""

    _run_log_dir: Path | None = None

    @property
    def root_log_dir(self) -> str:
        """The base directory (made on first use when none was given)."""
        if self._root_log_dir is None:
            self._root_log_dir = tempfile.mkdtemp(prefix="torchelastic_")
        return self._root_log_dir

    def run_log_dir(self, run_id: str) -> Path:
        """``<root>/<run_id>_<random>``, made on the first call and the same afterwards.

        Raises:
            OSError: it cannot be created.
        """
        if self._run_log_dir is None:
            base = Path(self.root_log_dir)
            base.mkdir(parents=True, exist_ok=True)
            while True:
                path = base / f"{run_id}_{secrets.token_hex(4)}"
                try:
                    path.mkdir()
                except FileExistsError:
                    continue
                break
            self._run_log_dir = path
        return self._run_log_dir

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Make ``attempt_<n>/<local rank>/`` for each rank and return the destinations.

        Raises:
            OSError: a directory cannot be created.
        """
        dest = LogsDest()
        if not envs:
            return dest
        first = next(iter(envs.values()))
        run_dir = self.run_log_dir(first.get("TORCHELASTIC_RUN_ID", "run"))
        attempt = first.get(ATTEMPT_ENV, first.get("TORCHELASTIC_RESTART_COUNT", "0"))
        for local_rank in envs:
            rank_dir = run_dir / f"attempt_{attempt}" / str(local_rank)
            rank_dir.mkdir(parents=True, exist_ok=True)
            files = self.redirect_for(local_rank) | self.tee_for(local_rank)
            tee = self.tee_for(local_rank)
            out = str(rank_dir / "stdout.log") if files & Std.OUT else ""
            err = str(rank_dir / "stderr.log") if files & Std.ERR else ""
            dest.stdouts[local_rank] = out
            dest.stderrs[local_rank] = err
            if tee & Std.OUT:
                dest.tee_stdouts[local_rank] = out
            if tee & Std.ERR:
                dest.tee_stderrs[local_rank] = err
            dest.error_files[local_rank] = str(rank_dir / "error.json")
        attempt_dir = run_dir / f"attempt_{attempt}"
        dest.filtered_stdout = str(attempt_dir / "filtered_stdout.log")
        dest.filtered_stderr = str(attempt_dir / "filtered_stderr.log")
        return dest


class TorchLogsSpecs(LogsSpecs):
    """A torch ``LogsSpecs`` class (a ``--logs-specs`` plugin) behind our interface.

    The plugin is built with torch's keyword arguments and decides the directories: each
    worker's ``error.json`` and its ``stdout.log`` / ``stderr.log`` go in the directory of the
    error file the plugin's ``reify`` names. Which streams are redirected, teed or shown stays
    the flags' (``--redirects``, ``--tee``, ``--local-ranks-filter``).

    Args:
        cls: the plugin's class.
        log_dir, redirects, tee, local_ranks_filter: as for :class:`LogsSpecs`.
    """

    def __init__(
        self,
        cls: type[Any],
        log_dir: str | None,
        redirects: Std | dict[int, Std],
        tee: Std | dict[int, Std],
        local_ranks_filter: set[int] | None,
    ) -> None:
        super().__init__(log_dir, redirects, tee, local_ranks_filter)
        from torch.distributed.elastic.multiprocessing import Std as TorchStd

        def torch_std(value: Std | dict[int, Std]) -> Any:
            if isinstance(value, Std):
                return TorchStd(int(value))
            return {rank: TorchStd(int(std)) for rank, std in value.items()}

        self.plugin = cls(
            log_dir=log_dir,
            redirects=torch_std(redirects),
            tee=torch_std(tee),
            local_ranks_filter=local_ranks_filter,
        )

    @property
    def root_log_dir(self) -> str:
        """The plugin's root directory."""
        return str(self.plugin.root_log_dir)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """The plugin's destinations (its error files name each rank's directory)."""
        theirs = self.plugin.reify(envs)
        return LogsDest(
            stdouts=dict(theirs.stdouts),
            stderrs=dict(theirs.stderrs),
            tee_stdouts=dict(theirs.tee_stdouts),
            tee_stderrs=dict(theirs.tee_stderrs),
            error_files={lr: str(path) for lr, path in theirs.error_files.items()},
            filtered_stdout=str(getattr(theirs, "filtered_stdout", "")),
            filtered_stderr=str(getattr(theirs, "filtered_stderr", "")),
        )
