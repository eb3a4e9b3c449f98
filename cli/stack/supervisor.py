"""What `connector-push dev` runs, watched: start, restart, stop in reverse order.

Two kinds are supervised alike: the service processes it runs as `connector-push
<command>` children (worker, ingress, sandbox), and the servers it starts itself
(embedded Postgres, the Temporal dev server; a `Service`). One that exits on its own
(a crash, a kill) is restarted after a backoff that doubles while it keeps dying
young (1 s, 2 s, 4 s … 30 s) and resets once it has run `STABLE_S`; a restart that
fails (a port still taken) counts as dying young. Only one that dies young
`MAX_YOUNG_DEATHS` times in a row stops the stack (`ChildKeepsFailing`): it is
failing at start, not crashing. While one waits out its backoff it is `down()`,
which `dev status` shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, Protocol

from cli.stack.process import StackError, exit_status, stop_process

__all__ = [
    "BASE_BACKOFF_S",
    "MAX_BACKOFF_S",
    "MAX_YOUNG_DEATHS",
    "STABLE_S",
    "Child",
    "ChildKeepsFailing",
    "Service",
    "ServiceChild",
    "Supervised",
    "Supervisor",
    "exit_status",
]

STABLE_S: Final = 30.0
MAX_YOUNG_DEATHS: Final = 5
BASE_BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 30.0


class ChildKeepsFailing(StackError):
    """A child died young too many times in a row."""


class Service(Protocol):
    """A server the stack starts itself, outside `connector-push` (Postgres, Temporal)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def log_path(self) -> Path | None: ...

    def ended(self) -> str | None:
        """None while it runs; else how it ended (`killed by SIGKILL`)."""
        ...

    def start(self) -> None:
        """Start it (again); `StackError` when it cannot."""
        ...

    def stop(self) -> None: ...


@dataclass(kw_only=True)
class Supervised(ABC):
    """One supervised process and its restart bookkeeping."""

    name: str
    started_at: float
    restarts: int = 0
    young_deaths: int = 0
    restart_at: float | None = None  # set while waiting out the backoff
    last_end: str | None = None  # how it last ended, while it waits to restart

    @property
    @abstractmethod
    def pid(self) -> int | None: ...

    @property
    @abstractmethod
    def log_path(self) -> Path | None: ...

    @abstractmethod
    def poll(self) -> str | None:
        """None while it runs; else how it ended."""

    @abstractmethod
    def respawn(self) -> None:
        """Start it again; `StackError` when it cannot."""

    @abstractmethod
    def stop(self, timeout_s: float) -> None: ...


def _popen(args: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
        start_new_session=True,  # Ctrl-C reaches us only; we stop children in order.
    )


@dataclass(kw_only=True)
class Child(Supervised):
    """`connector-push <args>` run as a child process, logging to `log_file`."""

    args: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    log_file: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.log_file

    def poll(self) -> str | None:
        code = self.process.poll()
        return None if code is None else exit_status(code)

    def respawn(self) -> None:
        self.process = _popen(self.args, self.env, self.log)

    def stop(self, timeout_s: float) -> None:
        stop_process(self.process, timeout_s)
        self.log.close()


@dataclass(kw_only=True)
class ServiceChild(Supervised):
    service: Service

    @property
    def pid(self) -> int | None:
        return self.service.pid

    @property
    def log_path(self) -> Path | None:
        return self.service.log_path

    def poll(self) -> str | None:
        return self.service.ended()

    def respawn(self) -> None:
        self.service.start()
        if (ended := self.service.ended()) is not None:  # e.g. it found the old one "running"
            raise StackError(f"started, yet {ended}")

    def stop(self, timeout_s: float) -> None:
        self.service.stop()


@dataclass
class Supervisor:
    """Owns the dev stack's processes; each child logs to `log_dir/<name>.log`."""

    log_dir: Path
    children: list[Supervised] = field(default_factory=list)

    def spawn_cli(self, name: str, args: list[str], env: dict[str, str], now: float) -> Child:
        """Run `connector-push <args>` as a child with `env` added to ours."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{name}.log"
        log = path.open("ab")
        child = Child(
            name=name,
            started_at=now,
            args=args,
            env=env,
            process=_popen(args, env, log),
            log=log,
            log_file=path,
        )
        self.children.append(child)
        return child

    def watch(self, name: str, service: Service, now: float) -> ServiceChild:
        """Supervise a server already started (it is stopped with the children, after them)."""
        watched = ServiceChild(name=name, started_at=now, service=service)
        self.children.append(watched)
        return watched

    def first_exited(self) -> tuple[Supervised, str] | None:
        """The first one found not running, and how it ended."""
        for child in self.children:
            if (ended := child.poll()) is not None:
                return child, ended
        return None

    def restart_counts(self) -> dict[str, int]:
        return {child.name: child.restarts for child in self.children}

    def pids(self) -> dict[str, int]:
        return {child.name: pid for child in self.children if (pid := child.pid) is not None}

    def down(self) -> dict[str, str]:
        """What is waiting to be restarted, and how it ended."""
        return {
            child.name: child.last_end or "down"
            for child in self.children
            if child.restart_at is not None
        }

    def tend(self, now: float) -> list[str]:
        """Restart what is due, schedule restarts for what exited; one log line per event.

        Raises `ChildKeepsFailing` when a child has died young too often in a row.
        """
        lines: list[str] = []
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    lines.append(self._respawn(child, now))
                continue
            ended = child.poll()
            if ended is not None:
                lines.append(self._schedule_restart(child, ended, now, "exited"))
        return lines

    def _see_log(self, child: Supervised) -> str:
        return f"; see {child.log_path}" if child.log_path is not None else ""

    def _schedule_restart(self, child: Supervised, ended: str, now: float, what: str) -> str:
        young = now - child.started_at < STABLE_S
        child.young_deaths = child.young_deaths + 1 if young else 1
        if child.young_deaths >= MAX_YOUNG_DEATHS:
            raise ChildKeepsFailing(
                f"{child.name} keeps failing at start ({ended}, "
                f"{child.young_deaths} times in a row){self._see_log(child)}"
            )
        delay = min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** (child.young_deaths - 1))
        child.restart_at, child.last_end = now + delay, ended
        return (
            f"{child.name} {what} ({ended}); restart #{child.restarts + 1} "
            f"in {delay:.0f}s{self._see_log(child)}"
        )

    def _respawn(self, child: Supervised, now: float) -> str:
        child.started_at, child.restart_at = now, None
        try:
            child.respawn()
        except StackError as exc:  # e.g. its port still taken: it died young once more
            return self._schedule_restart(child, str(exc), now, "did not restart")
        child.restarts += 1
        child.last_end = None
        return f"{child.name} restarted (restart #{child.restarts}, pid {child.pid})"

    def stop_all(self, timeout_s: float = 25.0) -> None:
        """Stop each, newest first (the servers after what uses them); SIGTERM and wait,
        SIGKILL what does not exit in time."""
        for child in reversed(self.children):
            child.stop(timeout_s)
        self.children.clear()
