"""`connector-push push`: report a save for every matching record (initial sync, SPEC API-3).

Admission runs in this process against Postgres with bounded concurrency; waking
each workflow is best effort (API-2). Resumable: records already linked, or whose
create slot is held by an attempt, are skipped before admission, so a second run
admits nothing for them. Ctrl-C stops admitting; every committed admission stands
(the relay dispatches any whose wake-up was cut short).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from cli.database import AsJson, DatabaseUrl, bad_input, echo_json, resolve_dsn
from cli.errors import EXIT_REJECTED
from cli.push_progress import PROGRESS_INTERVAL_S
from protocol.states import ATTEMPT_RELEASED

if TYPE_CHECKING:  # imported where used: the CLI starts without them (issue 31)
    import asyncpg
    from temporalio.client import Client

    from cli.push_progress import Tally
    from protocol.admission import SaveRequest

PAGE: Final = 200
EXIT_INTERRUPTED: Final = 130
_RELEASED: Final = [s.value for s in ATTEMPT_RELEASED]

_stderr = Console(stderr=True)


@dataclass(frozen=True)
class Target:
    owner_key: str
    action_slot: str
    destination_slot: str
    source_object: str
    user: str | None

    def key(self, record_id: str) -> str:
        from protocol.identity import link_key

        return link_key(
            self.owner_key, self.action_slot, self.source_object, record_id, self.destination_slot
        )

    def save(self, record_id: str) -> SaveRequest:
        from protocol.admission import SaveRequest

        return SaveRequest(
            connector_owner_key=self.owner_key,
            action_slot_id=self.action_slot,
            destination_slot_id=self.destination_slot,
            source_object=self.source_object,
            source_record_id=record_id,
            originating_user_id=self.user,
        )


# How often progress (finalized, parked) is read while saves are admitted or settle.
WATCH_INTERVAL_S = 0.5


async def resolve_target(
    pool: asyncpg.Pool, owner_key: str, action_slot: str, user: str | None
) -> Target:
    from services.packs import get_active_pack

    async with pool.acquire() as conn:
        pack = await get_active_pack(conn, owner_key)
    slot = (
        next((s for s in pack.manifest.action_slots if s.id == action_slot), None) if pack else None
    )
    if slot is None:
        bad_input(f"owner key {owner_key!r} has no active pack with action slot {action_slot!r}")
    return Target(owner_key, action_slot, slot.destination_slot, slot.source_object, user)


async def pages(
    pool: asyncpg.Pool, target: Target, record_ids: list[str], tally: Tally
) -> AsyncIterator[list[str]]:
    """Record ids to consider, a page at a time (the named ones, or all of the object)."""
    from db import push as q

    if record_ids:
        async with pool.acquire() as conn:
            live = await q.live_record_ids(conn, target.source_object, record_ids)
        tally.not_found = [r for r in record_ids if r not in live]
        yield [r for r in dict.fromkeys(record_ids) if r in live]
        return
    after = ""
    while True:
        async with pool.acquire() as conn:
            page = await q.record_ids_after(conn, target.source_object, after, PAGE)
        if not page:
            return
        yield page
        after = page[-1]


async def unclaimed(pool: asyncpg.Pool, target: Target, page: list[str], tally: Tally) -> list[str]:
    """The page without records already linked or with an attempt holding the slot.

    Both reads share one snapshot: a create that finalizes between two separate reads
    (not linked yet, then its attempt already released) would look unclaimed and be
    counted as a new admission (seen under a loaded test run).
    """
    from db import push as q

    keys = {r: target.key(r) for r in page}
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        linked = await q.linked_keys(conn, list(keys.values()))
        occupied = await q.occupied_keys(conn, list(keys.values()), _RELEASED)
    tally.skipped_linked += sum(k in linked for k in keys.values())
    tally.skipped_active += sum(k in occupied and k not in linked for k in keys.values())
    return [r for r, k in keys.items() if k not in linked and k not in occupied]


@dataclass(frozen=True)
class Run:
    pool: asyncpg.Pool
    client: Client | None
    task_queue: str
    target: Target
    concurrency: int


async def _report(run: Run, record_id: str, tally: Tally) -> None:
    from protocol.admission import ObservedActiveAttempt, Rejected
    from services.save_entry import WakeStatus, admit_one, wake_best_effort

    save = run.target.save(record_id)
    decision = await admit_one(run.pool, save)
    if isinstance(decision, Rejected):
        tally.rejected[decision.reason.value] += 1
    elif isinstance(decision, ObservedActiveAttempt):
        tally.observed_active += 1
    else:
        tally.admitted_keys.append(run.target.key(record_id))
    wake = await wake_best_effort(run.client, run.task_queue, decision, pool=run.pool, save=save)
    if wake is WakeStatus.DEFERRED:
        tally.wake_deferred += 1


async def admit_all(run: Run, record_ids: list[str], limit: int | None, tally: Tally) -> None:
    gate = asyncio.Semaphore(run.concurrency)
    budget = limit

    async def one(record_id: str) -> None:
        async with gate:
            await _report(run, record_id, tally)

    async for page in pages(run.pool, run.target, record_ids, tally):
        todo = await unclaimed(run.pool, run.target, page, tally)
        if budget is not None:
            todo, budget = todo[:budget], budget - len(todo[:budget])
        await asyncio.gather(*(one(r) for r in todo))
        if budget == 0:
            return


async def watch(pool: asyncpg.Pool, tally: Tally) -> None:
    """Keep `tally.statuses` current for this run's admitted links."""
    from db import push as q

    async with pool.acquire() as conn:
        tally.statuses = await q.latest_attempt_statuses(conn, tally.admitted_keys)


@dataclass(frozen=True)
class Display:
    """Where progress goes: a live line on a terminal, else plain lines on stderr."""

    live: Live | None
    every_s: float = PROGRESS_INTERVAL_S


async def push(
    dsn: str,
    target_args: tuple[str, str, str | None],
    record_ids: list[str],
    limit: int | None,
    concurrency: int,
    wait: bool,
    tally: Tally,
    display: Display,
) -> None:
    from cli.entry import admission_pool, connect_best_effort, runtime_settings
    from cli.push_progress import ProgressLines, progress_line, scope_of
    from services.rate_limit import pack_change_listener

    settings = runtime_settings()
    # The budget-rate cache beside a listener: no periodic re-read over a long push (P2).
    async with admission_pool(dsn, max_size=concurrency + 1) as pool, pack_change_listener(pool):
        target = await resolve_target(pool, *target_args)
        scope = await scope_of(
            pool, target.owner_key, target.destination_slot, target.source_object, record_ids, limit
        )
        lines = ProgressLines(scope, display.every_s) if display.live is None else None
        client = await connect_best_effort(settings)
        run = Run(pool, client, settings.task_queue, target, concurrency)
        admitting = asyncio.create_task(admit_all(run, record_ids, limit, tally))
        try:
            while not admitting.done() or (wait and not tally.settled):
                if admitting.done():
                    await asyncio.sleep(WATCH_INTERVAL_S)  # only watching now: poll, not spin
                else:
                    await asyncio.wait([admitting], timeout=WATCH_INTERVAL_S)
                await watch(pool, tally)
                if display.live is not None:
                    display.live.update(Text(progress_line(tally, scope)))
                elif lines is not None:
                    lines.tick(tally)
            await admitting
        finally:  # Ctrl-C: stop admitting; a cancelled admission rolls back, committed ones stand
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
            int, typer.Option("--concurrency", min=1, max=64, help="admissions in flight")
        ] = 8,
        wait: Annotated[
            bool, typer.Option("--wait/--no-wait", help="watch until every save settles")
        ] = True,
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
        sync, API-3). Resumable: records already linked or with an active attempt are
        skipped. Ctrl-C stops admitting; admitted saves stand and are dispatched.

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
                        record_id or [],
                        limit,
                        concurrency,
                        wait,
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
