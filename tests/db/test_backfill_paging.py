"""Backfill at any size (issue 34 item 3, NF-7): paged runs decide exactly what one page
does, an interrupted apply re-run adopts the rest exactly once, and no query reads more
than a page, against a real database."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from db.records import Conn
from protocol.backfill_facts import Outcome, RecordDecision, RejectReason
from services.backfill import BackfillRun, apply_backfill, plan_backfill, stream_backfill
from services.packs import apply_pack
from tests.db.backfill_support import DEST, MARKER, NOW, OWNER, PROV, RID, SLOT, demo, put

# Record i (c-0000i) by i % 6: no evidence; adoptable (marker); remote id only (rejected);
# a remote id shared with the record 6 further on (both rejected, on different pages);
# adoptable through the rebound predecessor slot; the runtime's link-key provenance of
# another slot (rejected).
INSERT_RECORDS = f"""
INSERT INTO crm_record (source_object, record_id, fields)
SELECT 'Contact', 'c-' || lpad(i::text, 5, '0'),
       jsonb_build_object('Email', 'c' || i || '@example.com', 'LastName', 'L' || i)
       || CASE i % 6
          WHEN 0 THEN '{{}}'::jsonb
          WHEN 1 THEN jsonb_build_object('{RID}', 'r-' || i, '{PROV}', '{MARKER}')
          WHEN 2 THEN jsonb_build_object('{RID}', 'r-' || i)
          WHEN 3 THEN jsonb_build_object('{RID}', 'dup-' || (i / 12), '{PROV}', '{MARKER}')
          WHEN 4 THEN jsonb_build_object(
              '{RID}', 'r-' || i, '{PROV}', '{OWNER}:push-contact-v0:{DEST}')
          ELSE jsonb_build_object('{RID}', 'r-' || i, '{PROV}', 'lk1_' || repeat('0', 64))
          END
FROM generate_series(0, $1 - 1) AS i
"""


async def _setup(conn: Conn, records: int) -> None:
    await apply_pack(conn, demo())
    await conn.execute(INSERT_RECORDS, records)


def _contacts(decisions: Sequence[RecordDecision]) -> list[RecordDecision]:
    return [d for d in decisions if d.action_slot_id == SLOT]


def _as_applied(decision: RecordDecision) -> RecordDecision:
    if decision.outcome is Outcome.ADOPTABLE:
        return decision.model_copy(update={"outcome": Outcome.ADOPTED})
    return decision


async def test_paged_plan_and_apply_decide_exactly_what_one_page_does(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        await _setup(conn, 360)
        whole = await plan_backfill(conn, OWNER, batch_size=100_000)
        paged = await plan_backfill(conn, OWNER, batch_size=7)
        applied = await apply_backfill(conn, OWNER, now=NOW, batch_size=7)
        links = await conn.fetchval("SELECT count(*) FROM connector_remote_link")
    outcomes = {d.outcome for d in _contacts(whole.decisions)}
    assert outcomes == {Outcome.SKIPPED, Outcome.ADOPTABLE, Outcome.REJECTED}
    assert len(_contacts(whole.decisions)) == 360
    assert paged.decisions == whole.decisions
    assert applied.decisions == tuple(_as_applied(d) for d in whole.decisions)
    # The shared remote ids sit 6 records (and so pages) apart: neither claimant adopted.
    assert whole.totals.adoptable == links == 120


class _Crash(Exception):
    pass


class _CrashAfter:
    """A `PageSink` whose process dies after `pages` committed pages."""

    def __init__(self, pages: int) -> None:
        self.pages = pages

    def begin(self, run: BackfillRun) -> None:
        assert run.applied

    def page(self, decisions: Sequence[RecordDecision]) -> None:
        self.pages -= 1
        if self.pages == 0:
            raise _Crash


async def test_an_interrupted_apply_rerun_adopts_the_rest_exactly_once(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        await conn.execute(
            f"""INSERT INTO crm_record (source_object, record_id, fields)
            SELECT 'Contact', 'c-' || lpad(i::text, 3, '0'),
                   jsonb_build_object('{RID}', 'r-' || i, '{PROV}', '{MARKER}')
            FROM generate_series(0, 59) AS i"""
        )
        with pytest.raises(_Crash):
            await stream_backfill(
                conn, OWNER, [SLOT], _CrashAfter(3), batch_size=7, apply_at=(NOW, "op")
            )
        assert await conn.fetchval("SELECT count(*) FROM connector_remote_link") == 21
        # A page that fails inside its transaction writes nothing of itself.
        await conn.execute(
            """CREATE FUNCTION fail_c040() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.source_record_id = 'c-040' THEN RAISE 'injected'; END IF;
            RETURN NEW; END $$;
            CREATE TRIGGER fail_c040 BEFORE INSERT ON connector_remote_link
            FOR EACH ROW EXECUTE FUNCTION fail_c040()"""
        )
        with pytest.raises(asyncpg.RaiseError):
            await apply_backfill(conn, OWNER, [SLOT], now=NOW, batch_size=7)
        assert await conn.fetchval("SELECT count(*) FROM connector_remote_link") == 35
        await conn.execute("DROP TRIGGER fail_c040 ON connector_remote_link")

        rerun = await apply_backfill(conn, OWNER, [SLOT], now=NOW, batch_size=7)
        again = await apply_backfill(conn, OWNER, [SLOT], now=NOW, batch_size=7)
        links = await conn.fetch(
            "SELECT source_record_id, count(*) AS n FROM connector_remote_link GROUP BY 1"
        )
        audited = await conn.fetchval("SELECT count(*) FROM connector_operator_audit")
    assert len(links) == 60 and {r["n"] for r in links} == {1} and audited == 60
    assert (rerun.totals.already_adopted, rerun.totals.adopted) == (35, 25)
    assert (again.totals.already_adopted, again.totals.adopted) == (60, 0)


class _Counting(asyncpg.Connection):
    """A real connection that remembers how many rows each `fetch` returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fetched: list[int] = []

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> list[Any]:
        rows: list[Any] = await super().fetch(query, *args, **kwargs)
        self.fetched.append(len(rows))
        return rows


async def test_no_query_reads_more_than_a_page_and_pages_reach_the_sink_one_by_one(
    db_dsn: str,
) -> None:
    conn = await asyncpg.connect(db_dsn, connection_class=_Counting)
    try:
        await _setup(conn, 300)
        pages: list[int] = []

        class Sink:
            def begin(self, run: BackfillRun) -> None:
                pass

            def page(self, decisions: Sequence[RecordDecision]) -> None:
                pages.append(len(decisions))

        conn.fetched.clear()
        planned = await stream_backfill(conn, OWNER, [SLOT], Sink(), batch_size=7)
        plan_reads, plan_pages = list(conn.fetched), list(pages)
        conn.fetched.clear()
        pages.clear()
        await stream_backfill(conn, OWNER, [SLOT], Sink(), batch_size=7, apply_at=(NOW, "op"))
    finally:
        await conn.close()
    assert planned.totals.adoptable == 100
    for reads, seen in ((plan_reads, plan_pages), (list(conn.fetched), pages)):
        assert seen == [7] * 42 + [6]
        # The contested query returns the 25 shared remote ids, every other read a page.
        assert sorted(reads)[-2:] == [7, 25], reads


async def test_a_remote_id_claimed_during_apply_rejects_that_record_only(
    db_pool: asyncpg.Pool,
) -> None:
    """The page's set-wise insert is refused whole; record by record, only c-2 fails."""
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        for i in (1, 2, 3):
            await put(conn, f"c-{i}", {RID: f"r-{i}", PROV: MARKER})
        # Another key's link takes c-2's remote id just before c-2's link is inserted.
        await conn.execute(
            """CREATE FUNCTION race() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE other connector_remote_link;
            BEGIN
              IF NEW.source_record_id = 'c-2' AND pg_trigger_depth() = 1 THEN
                other := NEW;
                other.link_key := 'lk1_' || repeat('f', 64);
                other.source_record_id := 'c-other';
                INSERT INTO connector_remote_link SELECT other.*;
              END IF;
              RETURN NEW;
            END $$;
            CREATE TRIGGER race BEFORE INSERT ON connector_remote_link
            FOR EACH ROW EXECUTE FUNCTION race()"""
        )
        report = await apply_backfill(conn, OWNER, [SLOT], now=NOW)
        linked = await conn.fetch("SELECT source_record_id FROM connector_remote_link ORDER BY 1")
    outcomes = {d.record_id: (d.outcome, d.reason) for d in report.decisions}
    assert outcomes == {
        "c-1": (Outcome.ADOPTED, None),
        "c-2": (Outcome.REJECTED, RejectReason.REMOTE_ID_CLAIMED_TWICE),
        "c-3": (Outcome.ADOPTED, None),
    }
    assert [r["source_record_id"] for r in linked] == ["c-1", "c-3"]
