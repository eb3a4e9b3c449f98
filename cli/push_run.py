"""The paged engine of `connector-push push` (API-3, NF-7): an initial
sync of any size in memory bounded by one page.

Records are read by keyset over the `crm_record` primary key (source_object,
record_id), `page_size` at a time. Each page is narrowed to the records neither linked
nor holding an attempt (one snapshot), admitted set-wise in one transaction (the HTTP
batch's admission: every key lock in one statement, in key order), and then its
workflows are woken, `concurrency` at a time. Two pages are admitted at once unless the
run is paced (`admit_all`). What the run keeps is counts, never a
list of its records or keys; its progress is read back as counts of the slot's attempts
created since the run began.

Resuming needs no cursor of its own: a second run pages from the start and skips, page
by page and set-wise, every record already linked or held (three indexed reads per
page, no admission), so records added anywhere since the first run are considered
too, and a crash between an admission's commit and any cursor write cannot lose or
repeat a page.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
from temporalio.client import Client

from cli.database import bad_input
from cli.push_cmd import PAGE_SIZE
from cli.push_progress import IN_FLIGHT, Tally
from db import push as q
from protocol.admission import AdmissionDecision, ObservedActiveAttempt, Rejected, SaveRequest
from protocol.identity import link_key
from protocol.states import ATTEMPT_RELEASED
from services import push_admission
from services.packs import get_active_pack
from services.save_entry import WakeStatus, wake_best_effort

_RELEASED: Final = [s.value for s in ATTEMPT_RELEASED]
_IN_FLIGHT: Final = [s.value for s in IN_FLIGHT]
# How often a paced run re-reads its in-flight count while it waits for room.
PACE_POLL_S: Final = 1.0
# Pages an unpaced run admits at once (`admit_all`).
PAGES_AT_ONCE: Final = 2


@dataclass(frozen=True)
class Target:
    owner_key: str
    action_slot: str
    destination_slot: str
    source_object: str
    user: str | None

    def key(self, record_id: str) -> str:
        return link_key(
            self.owner_key, self.action_slot, self.source_object, record_id, self.destination_slot
        )

    def save(self, record_id: str) -> SaveRequest:
        return SaveRequest(
            connector_owner_key=self.owner_key,
            action_slot_id=self.action_slot,
            destination_slot_id=self.destination_slot,
            source_object=self.source_object,
            source_record_id=record_id,
            originating_user_id=self.user,
        )


async def resolve_target(
    pool: asyncpg.Pool, owner_key: str, action_slot: str, user: str | None
) -> Target:
    async with pool.acquire() as conn:
        pack = await get_active_pack(conn, owner_key)
    slot = (
        next((s for s in pack.manifest.action_slots if s.id == action_slot), None) if pack else None
    )
    if slot is None:
        bad_input(f"owner key {owner_key!r} has no active pack with action slot {action_slot!r}")
    return Target(owner_key, action_slot, slot.destination_slot, slot.source_object, user)


@dataclass(frozen=True)
class Run:
    pool: asyncpg.Pool
    client: Client | None
    task_queue: str
    target: Target
    concurrency: int
    page_size: int = PAGE_SIZE
    # NF-8: at most this many of the run's saves in flight (admitted, not settled); None:
    # admit as fast as Postgres takes them (`push_cmd.in_flight_cap`).
    in_flight_cap: int | None = None


async def pages(run: Run, record_ids: list[str], tally: Tally) -> AsyncIterator[list[str]]:
    """Record ids to consider, a page at a time (the named ones, or all of the object)."""
    if record_ids:
        async with run.pool.acquire() as conn:
            live = await q.live_record_ids(conn, run.target.source_object, record_ids)
        tally.not_found = [r for r in record_ids if r not in live]
        named = [r for r in dict.fromkeys(record_ids) if r in live]
        for start in range(0, len(named), run.page_size):
            yield named[start : start + run.page_size]
        return
    after = ""
    while True:
        async with run.pool.acquire() as conn:
            page = await q.record_ids_after(conn, run.target.source_object, after, run.page_size)
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
    keys = {r: target.key(r) for r in page}
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        linked = await q.linked_keys(conn, list(keys.values()))
        occupied = await q.occupied_keys(conn, list(keys.values()), _RELEASED)
    tally.skipped_linked += sum(k in linked for k in keys.values())
    tally.skipped_active += sum(k in occupied and k not in linked for k in keys.values())
    return [r for r, k in keys.items() if k not in linked and k not in occupied]


def _count(tally: Tally, decision: AdmissionDecision) -> None:
    if isinstance(decision, Rejected):
        tally.rejected[decision.reason.value] += 1
    elif isinstance(decision, ObservedActiveAttempt):
        tally.observed_active += 1
    else:
        tally.admitted += 1


async def admit_page(run: Run, record_ids: list[str], tally: Tally) -> None:
    """Admit a page in one transaction, then wake its workflows (best effort, API-2). A
    cancellation before the commit admits none of the page; after it, every admission
    stands and a wake-up cut short is the relay's."""
    saves = [run.target.save(r) for r in record_ids]
    decisions = await push_admission.admit_set(run.pool, saves)
    for decision in decisions:
        _count(tally, decision)
    gate = asyncio.Semaphore(run.concurrency)

    async def wake(save: SaveRequest, decision: AdmissionDecision) -> None:
        async with gate:
            status = await wake_best_effort(
                run.client, run.task_queue, decision, pool=run.pool, save=save, bulk=True
            )
        if status is WakeStatus.DEFERRED:
            tally.wake_deferred += 1

    await asyncio.gather(*(wake(s, d) for s, d in zip(saves, decisions, strict=True)))


class _Window:
    """At most `depth` page admissions running at once. A page's failure is raised by the
    next `submit` or by `drain`; `cancel` stops whatever still runs (each page's
    transaction rolls back or has committed whole, as with one page at a time)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.running: set[asyncio.Task[None]] = set()

    def _reap(self) -> None:
        for task in [t for t in self.running if t.done()]:
            self.running.discard(task)
            task.result()

    async def submit(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            self._reap()
            while len(self.running) >= self.depth:
                await asyncio.wait(self.running, return_when=asyncio.FIRST_COMPLETED)
                self._reap()
        except BaseException:
            work.close()  # never started: nothing of it ran
            raise
        self.running.add(asyncio.create_task(work))

    async def drain(self) -> None:
        while self.running:
            await asyncio.wait(self.running, return_when=asyncio.FIRST_EXCEPTION)
            self._reap()

    async def finish(self) -> None:
        """Let whatever still runs end on its own (its own outcome, raised or not)."""
        await asyncio.gather(*self.running, return_exceptions=True)
        self.running.clear()

    async def cancel(self) -> None:
        for task in self.running:
            task.cancel()
        await self.finish()


async def admit_all(run: Run, record_ids: list[str], limit: int | None, tally: Tally) -> None:
    """Admit every unclaimed record, a page per transaction. An unpaced run keeps
    `PAGES_AT_ONCE` pages in flight, so that one page's decisions (this process's CPU)
    overlap another's writes (Postgres's); their key sets are disjoint, so the two
    transactions never wait on each other's locks. A paced run admits one page at a
    time, each committed before its room is read: the in-flight count it reads must
    include every page the run admitted (a page still open would be counted as room)."""
    paced = run.in_flight_cap is not None
    window = _Window(PAGES_AT_ONCE)
    budget = limit
    try:
        async for page in pages(run, record_ids, tally):
            todo = await unclaimed(run.pool, run.target, page, tally)
            if budget is not None:
                todo, budget = todo[:budget], budget - len(todo[:budget])
            while todo:
                if paced:
                    await window.drain()
                room = await room_in_flight(run, tally)
                await window.submit(admit_page(run, todo[:room], tally))
                todo = todo[room:]
            if budget == 0:
                break
        await window.drain()
    except Exception:
        # A failed page leaves the others to finish: cut short in its commit, a page could
        # stand in Postgres and be missing from the run's counts.
        await window.finish()
        raise
    finally:
        await window.cancel()  # cancelled (Ctrl-C): each open page commits whole or not at all


async def room_in_flight(run: Run, tally: Tally) -> int:
    """How many saves the run may admit now: under its in-flight cap, wait (polling the
    slot's attempt counts) until the budget has sent enough of what was admitted (NF-8).

    A bulk sync admitted at once starts a workflow per record, and every one of them is
    a workflow task the workers must run before the remote's budget lets a request out:
    twenty thousand at once held two workers for minutes, and another tenant's single
    save queued behind them (P10 read 33x its idle latency). Admitted at the budget's
    pace, the backlog stays a few windows deep, here in Postgres as records not yet
    admitted, so a crash or Ctrl-C leaves nothing to redo (a second run skips what the
    first admitted)."""
    cap = run.in_flight_cap
    if cap is None:
        return run.page_size
    assert tally.since is not None, "start_watching first"
    while True:
        async with run.pool.acquire() as conn:
            in_flight = await q.slot_in_flight(
                conn, run.target.owner_key, run.target.action_slot, tally.since, _IN_FLIGHT
            )
        if in_flight < cap:
            tally.paced_at = None
            return cap - in_flight
        tally.paced_at = in_flight
        await asyncio.sleep(PACE_POLL_S)  # the budget drains the run's saves meanwhile


async def start_watching(pool: asyncpg.Pool, tally: Tally) -> None:
    """Mark the run's start on the server's clock: its attempts are those created after."""
    async with pool.acquire() as conn:
        tally.since = await q.database_now(conn)


async def watch(pool: asyncpg.Pool, target: Target, tally: Tally) -> None:
    """Keep `tally.statuses` current: counts of the slot's attempts since the run began."""
    assert tally.since is not None, "start_watching first"
    async with pool.acquire() as conn:
        tally.statuses = await q.slot_attempt_statuses(
            conn, target.owner_key, target.action_slot, tally.since
        )
