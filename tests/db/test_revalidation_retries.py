"""SPEC §9 REV-2, invariant 5 against real Postgres: a retry is verify-only, and the next
operation chains on the receipt the last one left."""

from __future__ import annotations

import asyncio

import asyncpg

from protocol.link_row import (
    ROW_DIGEST_EXCLUDED_COLUMNS,
    LinkRowState,
)
from protocol.revalidation import RevalidationStatus
from services.revalidation import apply, validate
from tests.db.revalidation_support import C, Links, S, hex64, plan, reasons, state
from tests.db.revalidation_support import links as links

# -- invariant 5: verify-only retries ------------------------------------------------------


async def test_reapplying_is_already_applied_and_writes_nothing(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    first = await apply(conn, manifest)
    after = await state(conn)
    for entry in (apply, validate):
        again = await entry(conn, manifest)
        assert again.status is S.ALREADY_APPLIED and again.receipts == first.receipts
    assert await state(conn) == after


async def test_concurrent_applies_of_one_operation_apply_once(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)

    async def run() -> RevalidationStatus:
        async with db_pool.acquire() as c:
            return (await apply(c, manifest)).status

    statuses = await asyncio.gather(run(), run())
    assert sorted(statuses) == sorted([S.APPLIED, S.ALREADY_APPLIED])
    assert len((await state(conn))[1]) == len(links.keys)


async def test_a_retry_after_another_operation_moved_a_member_fails_closed(
    conn: asyncpg.Connection, links: Links
) -> None:
    first = await plan(conn, links, links.keys[:2], op="op-1")
    assert (await apply(conn, first)).status is S.APPLIED
    second = await plan(conn, links, links.keys[1:2], op="op-2", to="3")
    assert (await apply(conn, second)).status is S.APPLIED
    before = await state(conn)
    assert reasons(await apply(conn, first)) == [(links.keys[1], C.DIVERGENT_LINK)]
    assert await state(conn) == before


async def test_reusing_an_operation_id_for_more_members_is_mixed_state(
    conn: asyncpg.Connection, links: Links
) -> None:
    wider = await plan(conn, links, links.keys[:2])  # same op id, one more member
    assert (await apply(conn, await plan(conn, links, links.keys[:1]))).status is S.APPLIED
    before = await state(conn)
    assert (links.keys[1], C.MIXED_STATE) in reasons(await apply(conn, wider))
    assert await state(conn) == before


# -- the receipt chain ------------------------------------------------------------------------


async def test_the_next_operation_chains_on_the_receipt_and_needs_its_evidence(
    conn: asyncpg.Connection, links: Links
) -> None:
    key = links.keys[0]
    assert (await apply(conn, await plan(conn, links, [key], op="op-1"))).status is S.APPLIED
    second = await apply(conn, await plan(conn, links, [key], op="op-2", to="3"))
    assert second.status is S.APPLIED and second.receipts[0].previous_operation_id == "op-1"
    # An out-of-band write leaves the fingerprints unexplained by the pointed-at receipt.
    await conn.execute(
        "UPDATE connector_remote_link SET body_fingerprint = $2 WHERE link_key = $1",
        key,
        hex64("hand-edited"),
    )
    third = await apply(conn, await plan(conn, links, [key], op="op-3", to="4"))
    assert reasons(third) == [(key, C.RECEIPT_CHAIN_BROKEN)]


async def test_every_link_column_is_digested_or_deliberately_excluded(
    conn: asyncpg.Connection,
) -> None:
    columns = await conn.fetch(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_name = 'connector_remote_link'"
    )
    digested = set(LinkRowState.model_fields)
    assert {c["column_name"] for c in columns} == digested | ROW_DIGEST_EXCLUDED_COLUMNS
    assert not digested & ROW_DIGEST_EXCLUDED_COLUMNS
