"""An admission racing a bulk revalidation of its owner (issue 34, SPEC §9 REV-2, C-4).

The revalidation holds one lock per owner key, exclusively, for its whole transaction;
every admission (any path taking a link key's lock) takes its link's owner scope shared
first. So, deterministically (the apply is held open just before it commits):

* an admission that starts while the apply holds its lock waits, and then decides on the
  links as the apply left them (a PATCH, not the install change's fail-closed refusal);
* an apply that starts while an admission holds its link's lock waits, and then judges
  the link as the admission left it (suspended by the refusal: the manifest is rejected);
* another owner's link locks are never held up by it;
* the apply's locks in Postgres's lock table are as many for a 3-link manifest as for a
  manifest of every other link: they do not grow with the manifest.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bench.revalidation_bench import ACTION, APPROVAL, DESTINATION, OBJECT, OWNER, seed
from bench.stack import FIELDS
from db import links as links_q
from db import revalidation as q
from protocol.admission import AdmissionDecision, PatchQueued, Rejected, SaveRequest
from protocol.errors import RejectReason as Why
from protocol.revalidation import ConflictReason, RevalidationResult, RevalidationStatus
from services import revalidation, revalidation_plan
from services.admission import admit_locked, admit_save
from services.record_loader import load_records, parse_records_document
from services.revalidation_source import ManifestFile
from tests.db.rows import insert_link, insert_pack_install
from tests.e2e.support import eventually

LINKS = 12
RECORD = "p4-0000003"  # one of the seeded links' records
WAIT = 10.0  # seconds any wait on a condition below may take before the test fails


@pytest.fixture
async def install(conn: asyncpg.Connection) -> str:
    """LINKS finalized links of OWNER under install A, install B active; RECORD loaded."""
    new_install = await seed(conn, LINKS)
    document = {
        "records": [{"object": OBJECT, "id": RECORD, "fields": {"Email": "r3@example.com"}}],
        "grants": [{"user": "bench", "object": OBJECT, "records": "*", "fields": FIELDS}],
    }
    await load_records(conn, parse_records_document(document))
    return new_install


async def _manifest(
    conn: asyncpg.Connection, install: str, path: Path, keys: tuple[str, ...] | None = None
) -> ManifestFile:
    request = revalidation_plan.PlanRequest(
        operation_id=path.stem, approval=APPROVAL, new_pack_install_id=install, link_keys=keys
    )
    with path.open("wb") as out:
        await revalidation_plan.write_plan(conn, request, out)
    return ManifestFile.open(path)


def _save() -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=ACTION,
        destination_slot_id=DESTINATION,
        source_object=OBJECT,
        source_record_id=RECORD,
        originating_user_id="bench",
    )


def _keys() -> tuple[str, str]:
    fresh = str(uuid.uuid4())
    return fresh, f"cp-{fresh}"


async def _admit(pool: asyncpg.Pool) -> AdmissionDecision:
    idempotency, locator = _keys()
    now = datetime.now(UTC)
    return await admit_save(pool, _save(), idempotency_key=idempotency, locator_value=locator,
                            now=now)  # fmt: skip


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait (polling Postgres, bounded by WAIT) until `check` holds."""
    await eventually(check, bool, timeout_s=WAIT, interval_s=0.01)
    assert await check(), what


async def _waiting_on_advisory(conn: asyncpg.Connection, pid: int | None = None) -> bool:
    found = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND ($1::int IS NULL OR pid = $1)",
        pid,
    )
    return bool(found)


class HeldApply:
    """An apply held open at its last statement (the audit), until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached, self.release = asyncio.Event(), asyncio.Event()
        audit = q.audit_operation

        async def held(conn: Any, *args: Any) -> None:
            await audit(conn, *args)
            self.reached.set()
            await self.release.wait()

        monkeypatch.setattr(q, "audit_operation", held)

    async def start(self, dsn: str, manifest: ManifestFile) -> asyncio.Task[RevalidationResult]:
        self.conn = await asyncpg.connect(dsn)
        task = asyncio.ensure_future(revalidation.apply(self.conn, manifest))
        async with asyncio.timeout(WAIT):
            await self.reached.wait()
        return task

    async def finish(self, task: asyncio.Task[RevalidationResult]) -> RevalidationResult:
        self.release.set()
        try:
            async with asyncio.timeout(WAIT):
                return await task
        finally:
            await self.conn.close()


async def test_an_admission_waits_for_the_apply_and_sees_the_links_it_moved(
    conn: asyncpg.Connection,
    db_dsn: str,
    db_pool: asyncpg.Pool,
    install: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manifest = await _manifest(conn, install, tmp_path / "op-all.jsonl")
    held = HeldApply(monkeypatch)
    applying = await held.start(db_dsn, manifest)
    admitting = asyncio.ensure_future(_admit(db_pool))
    await _until(lambda: _waiting_on_advisory(conn), "the admission waits for the apply")
    assert not admitting.done()
    # Another owner's link locks are other keys: never held up by this apply.
    other = await insert_link(conn, await insert_pack_install(conn))
    async with db_pool.acquire() as free, free.transaction():
        async with asyncio.timeout(WAIT):
            await links_q.lock_link_key(free, other)
    assert not admitting.done()

    applied = await held.finish(applying)
    assert applied.status is RevalidationStatus.APPLIED and applied.receipt_count == LINKS
    async with asyncio.timeout(WAIT):
        decision = await admitting
    # After the apply: the link is validated against install B, so the save PATCHes (before
    # it, the install change refuses it fail-closed: the reverse test below).
    assert isinstance(decision, PatchQueued), decision


async def test_an_apply_waits_for_an_admission_and_judges_what_it_left(
    conn: asyncpg.Connection,
    db_dsn: str,
    db_pool: asyncpg.Pool,
    install: str,
    tmp_path: Path,
) -> None:
    manifest = await _manifest(conn, install, tmp_path / "op-all.jsonl")
    key = await conn.fetchval(
        "SELECT link_key FROM connector_remote_link WHERE source_record_id = $1", RECORD
    )
    apply_conn = await asyncpg.connect(db_dsn)
    try:
        async with db_pool.acquire() as admission, admission.transaction():
            await links_q.lock_link_key(admission, key)
            idempotency, locator = _keys()
            now = datetime.now(UTC)
            decision = await admit_locked(admission, key, _save(), idempotency, locator, now)
            # Before the apply: the install change refuses the save and suspends the link.
            assert isinstance(decision, Rejected) and decision.reason is Why.DRIFT_FAIL_CLOSED
            applying = asyncio.ensure_future(revalidation.apply(apply_conn, manifest))
            pid = apply_conn.get_server_pid()
            await _until(lambda: _waiting_on_advisory(conn, pid), "the apply waits")
            assert not applying.done()
        async with asyncio.timeout(WAIT):
            result = await applying
    finally:
        await apply_conn.close()
    assert result.status is RevalidationStatus.REJECTED
    assert {c.link_key for c in result.conflicts} == {key}  # the one link it suspended
    assert ConflictReason.LINK_NOT_FINALIZED in {c.reason for c in result.conflicts}
    receipts = await conn.fetchval("SELECT count(*) FROM connector_link_revalidation_receipt")
    assert receipts == 0


async def test_the_apply_holds_as_many_locks_for_three_links_as_for_all_the_others(
    conn: asyncpg.Connection,
    db_dsn: str,
    install: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [row[0] for row in await conn.fetch(
        "SELECT link_key FROM connector_remote_link ORDER BY link_key COLLATE \"C\"")]  # fmt: skip
    counts: list[list[tuple[str, str]]] = []
    for name, chosen in (("op-three", tuple(keys[:3])), ("op-rest", None)):
        manifest = await _manifest(conn, install, tmp_path / f"{name}.jsonl", chosen)
        held = HeldApply(monkeypatch)
        applying = await held.start(db_dsn, manifest)
        rows = await conn.fetch(
            "SELECT locktype, mode FROM pg_locks WHERE pid = $1 AND locktype <> 'relation'"
            " ORDER BY locktype, mode",
            held.conn.get_server_pid(),
        )
        counts.append([(row["locktype"], row["mode"]) for row in rows])
        assert (await held.finish(applying)).status is RevalidationStatus.APPLIED
    three, rest = counts
    assert ("advisory", "ExclusiveLock") in three  # the owner scope, one lock
    assert three == rest, (three, rest)
    assert len(keys) - 3 == LINKS - 3
