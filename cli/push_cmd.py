"""`connector-push push`: report a save for every matching record (initial sync, SPEC API-3).

Admission runs in this process against Postgres, a page of records per transaction
(`cli.push_run`: memory bounded by the page at any size, NF-7); waking each
workflow is best effort (API-2). Resumable: records already linked, or whose create
slot is held by an attempt, are skipped before admission, so a second run admits
nothing for them. Ctrl-C stops admitting; every committed admission stands (the relay
dispatches any whose wake-up was cut short).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from cli.database import AsJson, DatabaseUrl, bad_input, echo_json, resolve_dsn
from cli.errors import EXIT_REJECTED
from cli.push_progress import PROGRESS_INTERVAL_S

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from cli.push_progress import Tally

EXIT_INTERRUPTED: Final = 130
# Records read, screened and admitted per round trip (`--page-size`; cli.push_run): one
# transaction holds one link-key lock per admitted record of its page.
PAGE_SIZE: Final = 200
MAX_PAGE_SIZE: Final = 1000

_stderr = Console(stderr=True)

# How often progress (finalized, parked) is read while saves are admitted or settle; at
# least this many times the last read's own duration apart, so that at a million
# attempts the count (a scan of the run's attempts, ~0.4 s there) takes at most a
# twenty-first of one Postgres core: the admission's own statements need the rest.
# Admitted counts are the run's own and stay live between reads.
WATCH_INTERVAL_S = 0.5
WATCH_SHARE: Final = 20

# NF-8: a run keeps about this many seconds of its budget's requests in flight (`--ahead`).
AHEAD_S: Final = 30.0


def in_flight_cap(per_second: float | None, ahead_s: float, concurrency: int) -> int | None:
    """How many of a run's saves may be in flight at once: `ahead_s` seconds of its
    budget's pace, never fewer than its wake-ups in flight; None (no cap) when the budget
    declares no rate or `--ahead 0` asks to admit everything at once."""
    if per_second is None or ahead_s == 0:
        return None
    return max(concurrency, math.ceil(per_second * ahead_s))


@dataclass(frozen=True)
class Display:
    """Where progress goes: a live line on a terminal, else plain lines on stderr."""

    live: Live | None
    every_s: float = PROGRESS_INTERVAL_S


@dataclass(frozen=True)
class Options:
    record_ids: list[str]
    limit: int | None
    concurrency: int
    page_size: int
    wait: bool
    ahead_s: float = AHEAD_S


async def push(
    dsn: str,
    target_args: tuple[str, str, str | None],
    options: Options,
    tally: Tally,
    display: Display,
) -> None:
    import asyncio

    from cli.entry import admission_pool, connect_best_effort, runtime_settings
    from cli.push_progress import ProgressLines, progress_line, scope_of
    from cli.push_run import (
        PAGES_AT_ONCE,
        Run,
        admit_all,
        resolve_target,
        start_watching,
        watch,
    )
    from services.rate_limit import pack_change_listener

    settings = runtime_settings()
    # The budget-rate cache beside a listener: no periodic re-read over a long push (P2).
    async with (
        # Its wake-ups, its pages in flight, and one for the reads between them.
        admission_pool(dsn, max_size=options.concurrency + PAGES_AT_ONCE + 1) as pool,
        pack_change_listener(pool),
    ):
        target = await resolve_target(pool, *target_args)
        scope = await scope_of(
            pool,
            target.owner_key,
            target.destination_slot,
            target.source_object,
            options.record_ids,
            options.limit,
        )
        lines = ProgressLines(scope, display.every_s) if display.live is None else None
        client = await connect_best_effort(settings)
        cap = in_flight_cap(scope.per_second, options.ahead_s, options.concurrency)
        run = Run(
            pool,
            client,
            settings.task_queue,
            target,
            options.concurrency,
            options.page_size,
            cap,
        )
        await start_watching(pool, tally)
        admitting = asyncio.create_task(admit_all(run, options.record_ids, options.limit, tally))
        pause = WATCH_INTERVAL_S
        try:
            while not admitting.done() or (options.wait and not tally.settled):
                if admitting.done():
                    await asyncio.sleep(pause)  # only watching now: poll, not spin
                else:
                    await asyncio.wait([admitting], timeout=pause)
                began = time.monotonic()
                await watch(pool, target, tally)
                pause = max(WATCH_INTERVAL_S, WATCH_SHARE * (time.monotonic() - began))
                if display.live is not None:
                    display.live.update(Text(progress_line(tally, scope)))
                elif lines is not None:
                    lines.tick(tally)
            await admitting
        finally:  # Ctrl-C: stop admitting; a cancelled page rolls back, committed ones stand
            admitting.cancel()
            await asyncio.gather(admitting, return_exceptions=True)


def register(app: typer.Typer) -> None:
    @app.command("push")
    def push_command(
        owner_key: Annotated[str, typer.Option("--owner-key", help="ConnectorOwnerKey")],
        action_slot: Annotated[str, typer.Option("--action-slot", help="ActionSlotId")],
        user: Annotated[str, typer.Option("--user", help="originating user id (authority)")],
        record_id: Annotated[
            list[str] | None, typer.Option("--record-id", help="a record to push (repeatable)")
        ] = None,
        all_records: Annotated[
            bool, typer.Option("--all", help="every live record of the slot's source object")
        ] = False,
        limit: Annotated[
            int | None,
            typer.Option("--limit", min=1, max=10**9, help="admit at most N saves this run"),
        ] = None,
        concurrency: Annotated[
            int, typer.Option("--concurrency", min=1, max=64, help="wake-ups in flight")
        ] = 8,
        page_size: Annotated[
            int,
            typer.Option(
                "--page-size",
                min=1,
                max=MAX_PAGE_SIZE,
                help="records read and admitted per transaction (memory is one page)",
            ),
        ] = PAGE_SIZE,
        wait: Annotated[
            bool, typer.Option("--wait/--no-wait", help="watch until every save settles")
        ] = True,
        ahead: Annotated[
            float,
            typer.Option(
                "--ahead",
                min=0,
                max=86400,
                help=(
                    "admit only this many seconds of the budget's requests ahead of what it"
                    " has sent (0: admit everything at once)"
                ),
            ),
        ] = AHEAD_S,
        progress_every: Annotated[
            float,
            typer.Option(
                "--progress-every",
                min=0.1,
                max=3600,
                help="seconds between progress lines on stderr when it is not a terminal",
            ),
        ] = PROGRESS_INTERVAL_S,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """Report a save for every matching record of the slot's source object (initial
        sync, API-3), a page of --page-size records per transaction, in memory bounded
        by the page. Resumable: records already linked or with an active attempt are
        skipped. Ctrl-C stops admitting; admitted saves stand and are dispatched.

        When the destination's budget declares a rate, admission keeps only --ahead
        seconds of it in flight, so a bulk sync does not flood the workers ahead of the
        remote's pace and other tenants' saves are not queued behind it (NF-8).

        Exits 3 when any save was rejected or a --record-id was not found (every other
        save stands), 130 when interrupted. Progress goes to stderr: a live line on a
        terminal, else (or with --json) a plain line every --progress-every seconds."""
        from cli.entry import run_closing_temporal
        from cli.push_progress import Tally

        if bool(record_id) == all_records:
            bad_input("pass --all or at least one --record-id (not both)")
        tally = Tally()
        show = not as_json and _stderr.is_terminal
        live = Live(Text(tally.line()), console=_stderr, refresh_per_second=4) if show else None
        args = (owner_key, action_slot, user)
        try:
            with live or contextlib.nullcontext():
                run_closing_temporal(
                    push(
                        resolve_dsn(database_url),
                        args,
                        Options(record_id or [], limit, concurrency, page_size, wait, ahead),
                        tally,
                        Display(live, progress_every),
                    )
                )
        except KeyboardInterrupt:
            tally.interrupted = True
        _print_summary(tally, as_json)
        if tally.interrupted:
            raise typer.Exit(EXIT_INTERRUPTED)
        if tally.rejected or tally.not_found:
            raise typer.Exit(EXIT_REJECTED)


def _print_summary(tally: Tally, as_json: bool) -> None:
    if as_json:
        echo_json(tally.summary())
        return
    console = Console()
    if tally.admitted == 0 and (tally.skipped_linked or tally.skipped_active):
        console.print(
            f"nothing to admit: {tally.skipped_linked} already linked, "
            f"{tally.skipped_active + tally.observed_active} with an active attempt",
            highlight=False,
        )
    console.print(Text(tally.line()), highlight=False)
    if tally.rejected:
        reasons = ", ".join(f"{r} {n}" for r, n in tally.rejected.most_common())
        console.print(f"rejected: {reasons}", highlight=False)
    if tally.not_found:
        console.print(f"not found: {', '.join(tally.not_found)}", highlight=False)
    if tally.wake_deferred:
        console.print(f"{tally.wake_deferred} wake-ups deferred to the relay", highlight=False)
    if tally.interrupted:
        console.print("interrupted: every admitted save stands; run again to continue")
