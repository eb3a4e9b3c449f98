"""`connector-push push --all` in pages (issue 34 item 2, SPEC API-3): every read and
every admission of a run handles at most one page of records, each record is admitted
exactly once across pages, and a run cut short mid-way is finished by the next, which
admits exactly the rest.

Each query function the run calls is wrapped (the real one still runs) to record how
many records it was asked about and how many rows it returned: the memory bound is that
no round trip carries more than the page, and the run keeps counts, not its records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import asyncpg
import pytest

from cli import push_run
from cli.push_progress import Tally
from cli.push_run import PAGES_AT_ONCE, Run, Target, admit_all, start_watching, watch
from db import push as push_q
from services import push_admission
from services.packs import apply_pack
from tests.db.batch_admission_support import OWNER, pack
from tests.db.push_support import load_bulk_contacts
from tests.e2e.support import eventually

N = 230
PAGE = 50
TARGET = Target(OWNER, "push-contact", "remote-contacts", "Contact", "alice")


class Sizes:
    """Per wrapped function: the size of each call's input list and of its result."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked: dict[str, list[int]] = {}
        self.returned: dict[str, list[int]] = {}
        for name in ("record_ids_after", "linked_keys", "occupied_keys"):
            monkeypatch.setattr(push_q, name, self.wrap(name, getattr(push_q, name)))
        monkeypatch.setattr(
            push_admission, "admit_set", self.wrap("admit_set", push_admission.admit_set)
        )

    def wrap(self, name: str, real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any) -> Any:
            self.asked.setdefault(name, []).extend(len(a) for a in args[1:] if isinstance(a, list))
            result = await real(*args)
            self.returned.setdefault(name, []).append(len(result))
            return result

        return counted

    def largest(self) -> int:
        return max(n for sizes in [*self.asked.values(), *self.returned.values()] for n in sizes)


async def _seed(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await apply_pack(conn, pack())
        await load_bulk_contacts(conn, N)


async def _attempts(pool: asyncpg.Pool) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT count(*) AS n, count(DISTINCT link_key) AS keys FROM connector_push_attempt"
    )
    assert row is not None
    return row["n"], row["keys"]


def _run(pool: asyncpg.Pool) -> Run:
    # No Temporal client: every wake-up is deferred to the relay, as with Temporal down.
    return Run(pool, None, "unused", TARGET, concurrency=4, page_size=PAGE)


async def test_each_record_is_admitted_once_and_no_round_trip_exceeds_the_page(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seed(db_pool)
    sizes = Sizes(monkeypatch)
    tally = Tally()
    await start_watching(db_pool, tally)
    await admit_all(_run(db_pool), [], None, tally)

    assert (tally.admitted, tally.wake_deferred) == (N, N)
    assert await _attempts(db_pool) == (N, N)
    assert sizes.returned["record_ids_after"] == [50, 50, 50, 50, 30, 0]
    # Two pages at once: they may finish in either order.
    admitted = sorted(sizes.asked["admit_set"])
    assert admitted == sorted(sizes.returned["admit_set"]) == [30] + [50] * 4
    assert sizes.largest() == PAGE
    await watch(db_pool, TARGET, tally)
    assert tally.statuses == {"pending": N} and not tally.settled

    again, sizes = Tally(), Sizes(monkeypatch)
    await admit_all(_run(db_pool), [], None, again)
    assert (again.admitted, again.skipped_active, again.considered) == (0, N, N)
    assert "admit_set" not in sizes.returned and sizes.largest() == PAGE
    assert await _attempts(db_pool) == (N, N)


async def test_an_unpaced_run_admits_the_next_page_while_one_is_still_open(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One page's decisions run in this process while another's writes run in Postgres:
    the first page's admission does not start until the second's has, and never more
    than PAGES_AT_ONCE are open (one page at a time, the first would wait forever)."""
    await _seed(db_pool)
    real = push_admission.admit_set
    second_started = asyncio.Event()
    calls = open_now = most = 0

    async def held_until_the_next_starts(pool: asyncpg.Pool, saves: Sequence[Any]) -> Any:
        nonlocal calls, open_now, most
        calls += 1
        first = calls == 1
        open_now += 1
        most = max(most, open_now)
        try:
            if calls == 2:
                second_started.set()
            if first:
                await asyncio.wait_for(second_started.wait(), timeout=30)
            return await real(pool, saves)
        finally:
            open_now -= 1

    monkeypatch.setattr(push_admission, "admit_set", held_until_the_next_starts)
    tally = Tally()
    await admit_all(_run(db_pool), [], None, tally)
    assert most == PAGES_AT_ONCE == 2
    assert tally.admitted == N and await _attempts(db_pool) == (N, N)


async def test_a_run_that_crashes_mid_way_is_finished_by_the_next_admitting_only_the_rest(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seed(db_pool)
    real = push_admission.admit_set
    pages_done = 0
    third_failed = asyncio.Event()

    async def crashes_on_the_third_page(pool: asyncpg.Pool, saves: Sequence[Any]) -> Any:
        nonlocal pages_done
        if pages_done == 2:
            third_failed.set()
            raise RuntimeError("the process dies here")
        pages_done += 1
        if pages_done == 2:  # the second page is still open when the third fails
            await asyncio.wait_for(third_failed.wait(), timeout=30)
        return await real(pool, saves)

    monkeypatch.setattr(push_admission, "admit_set", crashes_on_the_third_page)
    first = Tally()
    with pytest.raises(RuntimeError):
        await admit_all(_run(db_pool), [], None, first)
    # The second page, open beside the failing third (two at once), is left to finish:
    # what the run counted is what Postgres holds.
    admitted = first.admitted
    assert admitted == 2 * PAGE and await _attempts(db_pool) == (admitted, admitted)

    monkeypatch.setattr(push_admission, "admit_set", real)
    sizes = Sizes(monkeypatch)
    rest = Tally()
    await admit_all(_run(db_pool), [], None, rest)
    assert (rest.admitted, rest.skipped_active) == (N - admitted, admitted)
    assert await _attempts(db_pool) == (N, N)  # every record once, none twice
    assert sizes.largest() == PAGE


class OpenPages:
    """Pages the run has handed to admission and not seen finish, as each room check
    (`room_in_flight`) begins: a paced run must read its room with none open."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = 0
        self.at_room_checks: list[int] = []
        real_admit, real_room = push_run.admit_page, push_run.room_in_flight

        def admit(*args: Any) -> Awaitable[None]:
            self.open += 1  # counted when handed over, before the page has begun

            async def page() -> None:
                try:
                    await real_admit(*args)
                finally:
                    self.open -= 1

            return page()

        async def room(*args: Any) -> int:
            self.at_room_checks.append(self.open)
            return await real_room(*args)

        monkeypatch.setattr(push_run, "admit_page", admit)
        monkeypatch.setattr(push_run, "room_in_flight", room)


async def test_a_paced_run_keeps_at_most_its_cap_in_flight_and_admits_as_saves_settle(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NF-8 (issue 33 item 2): a run whose budget declares a rate admits only what the
    budget can send soon. Nothing drains the budget here, so admission stops at the cap
    and says so (`paced_at`); as saves settle (or wait in the deferred lane) it admits
    that many more, never a whole page at once. Each room is read with no page of the
    run still open (an open page's saves would be counted as room)."""
    await _seed(db_pool)
    pages_open = OpenPages(monkeypatch)
    tally = Tally()
    await start_watching(db_pool, tally)
    cap = 30

    async def paced() -> int | None:
        return tally.paced_at

    admitting = asyncio.create_task(
        admit_all(replace(_run(db_pool), in_flight_cap=cap), [], None, tally)
    )
    try:
        await eventually(lambda: _attempts(db_pool), lambda n: n == (cap, cap), timeout_s=30)
        await eventually(paced, lambda n: n == cap)
        assert not admitting.done()
        settled = await db_pool.execute(
            "UPDATE connector_push_attempt SET status = 'terminal_failed', last_error = 'test' "
            "WHERE attempt_id IN (SELECT attempt_id FROM connector_push_attempt LIMIT 20)"
        )
        assert settled == "UPDATE 20"
        await eventually(lambda: _attempts(db_pool), lambda n: n[0] == cap + 20, timeout_s=30)
        await eventually(paced, lambda n: n == cap)
        assert await _attempts(db_pool) == (cap + 20, cap + 20) and tally.admitted == cap + 20
        # A create waiting in the deferred association lane spends nothing until its
        # association is linked (maybe not before the sync ends): it holds no room.
        deferred = await db_pool.execute(
            "UPDATE connector_push_attempt SET dispatch_lane = 'deferred_association', "
            'association_source_ids = \'["", "acc-1"]\'::jsonb '
            "WHERE attempt_id IN (SELECT attempt_id FROM connector_push_attempt "
            "WHERE status = 'pending' LIMIT 5)"
        )
        assert deferred == "UPDATE 5"
        await eventually(lambda: _attempts(db_pool), lambda n: n[0] == cap + 25, timeout_s=30)
        await eventually(paced, lambda n: n == cap)
    finally:
        admitting.cancel()
        await asyncio.gather(admitting, return_exceptions=True)
    assert len(pages_open.at_room_checks) >= 3 and set(pages_open.at_room_checks) == {0}
