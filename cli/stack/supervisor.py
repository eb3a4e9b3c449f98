"""Child processes of `connector-push dev`: start, watch, stop in reverse order."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cli.stack.process import stop_process


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes] | None


@dataclass
class Supervisor:
    """Owns the dev stack's service processes; each logs to `log_dir/<name>.log`."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def spawn_cli(self, name: str, args: list[str], env: dict[str, str]) -> Child:
        """Run `connector-push <args>` as a child with `env` added to ours."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,  # Ctrl-C reaches us only; we stop children in order.
        )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def first_exited(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)

    def stop_all(self, timeout_s: float = 25.0) -> None:
        """SIGTERM each child, newest first, and wait; SIGKILL what does not exit in time."""
        for child in reversed(self.children):
            stop_process(child.process, timeout_s)
            if child.log is not None:
                child.log.close()
        self.children.clear()
