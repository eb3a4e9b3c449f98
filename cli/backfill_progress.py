"""How far `connector-push backfill plan|apply` is (NF-7), on stderr.

On a terminal a bar, once the run looks at more than `PROGRESS_THRESHOLD` records;
otherwise (a job's log, a pipe) a plain line at most every `interval_s` (the first
after the first page), as `push` does, so a run over a million records shows where
it is. stdout keeps the decisions.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Final, TextIO

from rich.console import Console
from rich.progress import Progress, TaskID

from cli.push_progress import PROGRESS_INTERVAL_S, duration

# Runs looking at more records than this show a bar on a terminal.
PROGRESS_THRESHOLD: Final = 100


class BackfillProgress:
    """`services.backfill.ProgressSink` for the command."""

    def __init__(
        self,
        mode: str,
        *,
        interval_s: float = PROGRESS_INTERVAL_S,
        stream: Callable[[], TextIO] = lambda: sys.stderr,
        clock: Callable[[], float] = time.monotonic,
        live: bool | None = None,
    ) -> None:
        self._mode = mode
        self._interval_s = interval_s
        self._stream = stream
        self._clock = clock
        self._live = stream().isatty() if live is None else live
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._started = clock()
        self._written_at: float | None = None
        self.total = 0
        self.done = 0

    def start(self, total: int) -> None:
        self.total = total
        self._started = self._clock()
        if self._live and total > PROGRESS_THRESHOLD:
            self._bar = Progress(console=Console(file=self._stream()), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("records", total=total)

    def advance(self, records: int) -> None:
        self.done += records
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, records)
        elif not self._live:
            self._tick()

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()

    def line(self) -> str:
        elapsed = max(self._clock() - self._started, 1e-6)
        rate = self.done / elapsed
        share = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        left = max(self.total - self.done, 0)
        eta = f", time left {duration(left / rate)}" if rate > 0 and left else ""
        return (
            f"backfill {self._mode}: {self.done} of {self.total} records{share}, "
            f"{rate:.0f} records/s{eta}"
        )

    def _tick(self) -> None:
        now = self._clock()
        if self._written_at is not None and now - self._written_at < self._interval_s:
            return
        self._written_at = now
        try:
            out = self._stream()
            out.write(self.line() + "\n")
            out.flush()
        except (OSError, ValueError):  # stderr closed: the run goes on
            self._interval_s = float("inf")
