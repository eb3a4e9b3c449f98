"""The dev stack's ownership of its data directory: one `dev.lock` held while it runs.

An `flock` on `<data_dir>/dev.lock`, taken before anything starts, so two
`connector-push dev` runs on one data directory (one after the other or at the
same moment) cannot both own it: the second reads who holds it and touches
nothing. The kernel drops the lock when the holder dies, so a crashed run never
leaves a stale lock behind. The file's body is the running stack's description
(PID, URLs, restart counts), which `dev env` and `dev status` print.
"""

from __future__ import annotations

import fcntl
import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Final

from cli.dsn import mask_dsn
from cli.stack.process import StackError

LOCK_FILE: Final = "dev.lock"


@dataclass
class StackInfo:
    """What a running stack publishes in its lock file."""

    pid: int
    database_url: str
    temporal_address: str
    temporal_namespace: str
    ui_url: str | None
    sandbox_url: str
    ingress_url: str
    restarts: dict[str, int] = field(default_factory=dict)
    children: dict[str, int] = field(default_factory=dict)  # name -> current PID
    # What exited and waits out its restart backoff -> how it ended.
    down: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """`running`, or `degraded` while something is down."""
        return "degraded" if self.down else "running"

    def shown(self) -> dict[str, object]:
        """The description for `dev status --json`: the Postgres password masked (`dev env`
        alone prints the DSN whole, for `eval`)."""
        return {**asdict(self), "database_url": mask_dsn(self.database_url), "state": self.state}

    def urls(self) -> str:
        """Where each service answers, the Postgres password masked (this line is shown)."""
        ui = f", UI {self.ui_url}" if self.ui_url else ""
        return (
            f"Postgres {mask_dsn(self.database_url)}, Temporal {self.temporal_address}{ui}, "
            f"sandbox {self.sandbox_url}, ingress {self.ingress_url}"
        )

    def exports(self) -> list[str]:
        """`dev env`'s lines for `eval`: the DSN whole (the shell needs it)."""
        values = {
            "DATABASE_URL": self.database_url,
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": self.temporal_namespace,
            "SANDBOX_URL": self.sandbox_url,
            "INGRESS_URL": self.ingress_url,
        }
        if self.ui_url:
            values["TEMPORAL_UI_URL"] = self.ui_url
        return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]


class StackRunning(StackError):
    """Another process owns the data directory."""


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_info(path: Path) -> StackInfo | None:
    try:
        return StackInfo(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None  # the holder has not written its description yet


def _running_message(data_dir: Path, info: StackInfo | None) -> str:
    who = f"pid {info.pid}: {info.urls()}" if info else "starting up"
    return (
        f"a dev stack is already running on {data_dir} ({who}); nothing was touched "
        "(use it, or stop it with Ctrl-C in its terminal)"
    )


class DataDirLock:
    """Held for the stack's lifetime; `publish` rewrites the description in place."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or raise `StackRunning` naming the holder; writes nothing then."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+", encoding="utf-8")
        if not _try_lock(handle):
            handle.close()
            raise StackRunning(_running_message(self.data_dir, _read_info(self.path)))
        self._handle = handle

    def publish(self, info: StackInfo) -> None:
        assert self._handle is not None, "publish before acquire"
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(json.dumps(asdict(info)))
        self._handle.flush()

    def release(self) -> None:
        if self._handle is not None:
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.close()  # closing drops the flock
            self._handle = None


def running_stack(data_dir: Path) -> StackInfo | None:
    """The running stack's description; None when no process holds the lock.

    Raises `StackRunning` when a stack holds it but has not published yet (starting up).
    """
    path = data_dir / LOCK_FILE
    if not path.exists():
        return None
    with path.open("a+", encoding="utf-8") as handle:
        if _try_lock(handle):
            return None  # nobody holds it (closing releases ours)
    if (info := _read_info(path)) is None:
        raise StackRunning(f"the dev stack on {data_dir} is still starting; try again shortly")
    return info
