"""Child processes of `connector-push dev`: start, watch, restart, stop in reverse order.

A child that exits on its own (a crash, a kill) is restarted after a backoff
that doubles while it keeps dying young (1 s, 2 s, 4 s … 30 s) and resets once it
has run `STABLE_S`; only a child that dies young `MAX_YOUNG_DEATHS` times in a
row stops the stack (`ChildKeepsFailing`): it is failing at start, not crashing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from cli.stack.process import StackError, stop_process

STABLE_S: Final = 30.0
MAX_YOUNG_DEATHS: Final = 5
BASE_BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 30.0


class ChildKeepsFailing(StackError):
    """A child died young too many times in a row."""


def exit_status(code: int) -> str:
    """`exit 3`, or `killed by SIGKILL` for a negative Popen return code."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@dataclass
class Child:
    name: str
    args: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log: IO[bytes] | None
    started_at: float
    restarts: int = 0
    young_deaths: int = 0
    restart_at: float | None = None  # set while waiting out the backoff


@dataclass
class Supervisor:
    """Owns the dev stack's service processes; each logs to `log_dir/<name>.log`."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def spawn_cli(self, name: str, args: list[str], env: dict[str, str], now: float) -> Child:
        """Run `connector-push <args>` as a child with `env` added to ours."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        child = Child(name, args, env, self._popen(args, env, log), log, now)
        self.children.append(child)
        return child

    @staticmethod
    def _popen(args: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,  # Ctrl-C reaches us only; we stop children in order.
        )

    def log_path(self, child: Child) -> Path:
        return self.log_dir / f"{child.name}.log"

    def first_exited(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)

    def restart_counts(self) -> dict[str, int]:
        return {child.name: child.restarts for child in self.children}

    def pids(self) -> dict[str, int]:
        return {child.name: child.process.pid for child in self.children}

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
            code = child.process.poll()
            if code is not None:
                lines.append(self._schedule_restart(child, code, now))
        return lines

    def _schedule_restart(self, child: Child, code: int, now: float) -> str:
        young = now - child.started_at < STABLE_S
        child.young_deaths = child.young_deaths + 1 if young else 1
        if child.young_deaths >= MAX_YOUNG_DEATHS:
            raise ChildKeepsFailing(
                f"{child.name} keeps failing at start ({exit_status(code)}, "
                f"{child.young_deaths} times in a row); see {self.log_path(child)}"
            )
        delay = min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** (child.young_deaths - 1))
        child.restart_at = now + delay
        return (
            f"{child.name} exited ({exit_status(code)}); restart #{child.restarts + 1} "
            f"in {delay:.0f}s; see {self.log_path(child)}"
        )

    def _respawn(self, child: Child, now: float) -> str:
        assert child.log is not None
        child.process = self._popen(child.args, child.env, child.log)
        child.started_at, child.restart_at = now, None
        child.restarts += 1
        return f"{child.name} restarted (restart #{child.restarts}, pid {child.process.pid})"

    def stop_all(self, timeout_s: float = 25.0) -> None:
        """SIGTERM each child, newest first, and wait; SIGKILL what does not exit in time."""
        for child in reversed(self.children):
            stop_process(child.process, timeout_s)
            if child.log is not None:
                child.log.close()
        self.children.clear()
