"""The product's CLI as a measured subprocess: wall time, exit code and peak RSS.

Peak RSS is the child's own `ru_maxrss`, read from `os.wait4` on its pid when it is
reaped (Linux reports KiB): the high-water mark of that one process, not a delta of
`RUSAGE_CHILDREN` (which is the maximum over every child reaped so far). A command can be
interrupted part-way with SIGINT, as Ctrl-C would, once a condition holds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import asyncpg

# Once SIGINT is sent, the command has this long to stop before the run counts as hung.
STOP_TIMEOUT_S: Final = 120.0
POLL_S: Final = 0.1
PROGRESS_S: Final = 15.0


@dataclass(frozen=True)
class Launched:
    """A started command: its pid, and a blocking wait for (exit code, peak RSS KiB)."""

    pid: int
    wait: Callable[[], tuple[int, int | None]]


class Launcher(Protocol):
    def __call__(
        self, args: Sequence[str], env: Mapping[str, str], stdout: Path, stderr: Path
    ) -> Launched: ...


def _interruptible() -> None:
    """In the child before exec: SIGINT to its default, so Python turns it into
    KeyboardInterrupt as at a terminal. A harness started in the background (`cmd &`
    from a script, nohup) inherits SIGINT ignored, and an ignored signal stays ignored
    across exec: the command would never see the Ctrl-C the run sends it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_launcher(
    args: Sequence[str], env: Mapping[str, str], stdout: Path, stderr: Path
) -> Launched:
    """`python -m cli ARGS` as a child of this process, reaped by `os.wait4`."""
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=dict(env),
            preexec_fn=_interruptible,
        )

    def wait() -> tuple[int, int | None]:
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        return process.returncode, usage.ru_maxrss

    return Launched(process.pid, wait)


@dataclass(frozen=True)
class CliRun:
    name: str
    exit_code: int
    seconds: float  # start to exit
    rss_mb: float | None  # None when the launcher cannot tell (a forked test child)
    stdout: Path
    stderr: Path
    interrupted_after_s: float | None = None  # when SIGINT was sent, if it was

    def stderr_tail(self, lines: int = 8) -> str:
        return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-lines:])

    def last_stdout_line(self) -> str:
        """The last line of stdout, read from the file's end (outputs can be large)."""
        with self.stdout.open("rb") as out:
            out.seek(0, os.SEEK_END)
            out.seek(max(0, out.tell() - 65_536))
            lines = out.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""


async def _progress(name: str, stderr: Path, started: float) -> None:
    """Every PROGRESS_S, a line: the command, how long it has run, its last stderr line
    (push and backfill write their own progress there when it is not a terminal)."""
    while True:
        await asyncio.sleep(PROGRESS_S)  # a progress cadence, not a synchronisation
        lines = stderr.read_text(errors="replace").strip().splitlines() if stderr.exists() else []
        last = f": {lines[-1][:120]}" if lines else ""
        print(f"  {name} {time.monotonic() - started:.0f} s{last}", file=sys.stderr, flush=True)


class CommandFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Cli:
    """How to run a command: the launcher, its environment, where its output goes."""

    launcher: Launcher
    env: Mapping[str, str]
    workdir: Path

    async def run(
        self,
        name: str,
        args: Sequence[str],
        *,
        expect: tuple[int, ...] = (0,),
        interrupt_when: Callable[[], Awaitable[None]] | None = None,
    ) -> CliRun:
        """Run the command to its end (or SIGINT it once `interrupt_when` returns); an exit
        code outside `expect` raises `CommandFailed` with the tail of its stderr."""
        out, err = self.workdir / f"{name}.out", self.workdir / f"{name}.err"
        started = time.monotonic()
        launched = self.launcher(args, self.env, out, err)
        reaped = asyncio.ensure_future(asyncio.to_thread(launched.wait))
        ticker = asyncio.ensure_future(_progress(name, err, started))
        interrupted_after: float | None = None
        if interrupt_when is not None:
            trigger = asyncio.ensure_future(interrupt_when())
            await asyncio.wait({reaped, trigger}, return_when=asyncio.FIRST_COMPLETED)
            if not reaped.done() and trigger.done() and trigger.exception() is None:
                interrupted_after = time.monotonic() - started
                os.kill(launched.pid, signal.SIGINT)
                await asyncio.wait({reaped}, timeout=STOP_TIMEOUT_S)
                if not reaped.done():
                    os.kill(launched.pid, signal.SIGKILL)
            elif not trigger.done():
                trigger.cancel()
            elif not reaped.done():
                os.kill(launched.pid, signal.SIGKILL)
                await asyncio.gather(reaped, return_exceptions=True)
                trigger.result()  # the condition's own error
        try:
            code, rss_kib = await reaped
        finally:
            ticker.cancel()
        result = CliRun(
            name,
            code,
            time.monotonic() - started,
            None if rss_kib is None else round(rss_kib / 1024, 1),
            out,
            err,
            interrupted_after,
        )
        if code not in expect:
            raise CommandFailed(
                f"`connector-push {' '.join(args)}` exited {code} (expected {expect}):\n"
                f"{result.stderr_tail()}"
            )
        return result


async def lock_waiter(dsn: str, timeout_s: float) -> None:
    """Return once some session of the database waits for an advisory lock (the command
    has committed every page before the one whose key lock the harness holds)."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        query = """
            SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
            WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()
        """
        while not await conn.fetchval(query):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no command waited on the held key lock in {timeout_s} s")
            await asyncio.sleep(POLL_S)  # polling interval; the condition is the lock wait
    finally:
        await conn.close()
