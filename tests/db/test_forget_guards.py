"""SPEC S-7: the one path by which values may be erased (migration 0225) admits nothing
else: only the operator role, only the erase itself, once, and only finished rows."""

from __future__ import annotations

import asyncpg
import pytest

from tests.db.roles_support import login_dsn

PAYLOAD = '{"email": "ada@example.com"}'


async def _event(conn: asyncpg.Connection, status: str = "processed") -> None:
    await conn.execute(
        "INSERT INTO connector_event (event_id, endpoint, event_type, handler, payload, "
        "first_receipt_id) VALUES ('ev-1', 'crm', 't', 'h', $1, 'rc-1')",
        PAYLOAD,
    )
    await conn.execute(
        "INSERT INTO ingress_receipt (receipt_id, endpoint, request_id, event_id, payload) "
        "VALUES ('rc-1', 'crm', 'rq-1', 'ev-1', $1)",
        PAYLOAD,
    )
    if status != "admitted":
        await conn.execute("UPDATE connector_event SET status = $1, status_reason = 'x'", status)


async def _payloads(conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch(
        "SELECT payload FROM connector_event UNION ALL SELECT payload FROM ingress_receipt"
    )
    return [r["payload"] for r in rows]


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        # an erase that changes anything else
        ("UPDATE connector_event SET values_erased_at = now(), endpoint = 'other'",
         "changes nothing but"),
        # smuggling a payload through the receipt's erase branch
        ("UPDATE ingress_receipt SET values_erased_at = now(), payload = '{}'",
         "changes nothing but"),
        # the receipt stays append-only for every other update
        ("UPDATE ingress_receipt SET payload = '{}'", "append-only"),
    ],
)  # fmt: skip
async def test_s7_an_erase_changes_nothing_else(
    conn: asyncpg.Connection, statement: str, message: str
) -> None:
    await _event(conn)
    with pytest.raises(asyncpg.PostgresError, match=message):
        await conn.execute(statement)
    assert await _payloads(conn) == [PAYLOAD, PAYLOAD]


async def test_s7_an_unprocessed_event_keeps_its_values(conn: asyncpg.Connection) -> None:
    await _event(conn, status="admitted")
    with pytest.raises(asyncpg.PostgresError, match="unfinished row keeps its values"):
        await conn.execute("UPDATE connector_event SET values_erased_at = now()")
    with pytest.raises(asyncpg.PostgresError, match="unfinished row keeps its values"):
        await conn.execute("UPDATE ingress_receipt SET values_erased_at = now()")
    assert await _payloads(conn) == [PAYLOAD, PAYLOAD]


async def test_s7_erased_once_for_good(conn: asyncpg.Connection) -> None:
    await _event(conn)
    await conn.execute("UPDATE connector_event SET values_erased_at = now()")
    for statement in (
        "UPDATE connector_event SET values_erased_at = NULL",
        "UPDATE connector_event SET values_erased_at = now() + interval '1 day'",
        f"UPDATE connector_event SET payload = '{PAYLOAD}'",
        "UPDATE connector_event SET erased_payload_sha256 = 'x'",
    ):
        with pytest.raises(asyncpg.PostgresError, match="erased"):
            await conn.execute(statement)
    assert await conn.fetchval("SELECT payload FROM connector_event") == '"connector-push:erased"'


async def test_s7_s4_only_the_operator_role_erases(conn: asyncpg.Connection, db_dsn: str) -> None:
    await _event(conn)
    worker = await asyncpg.connect(await login_dsn(db_dsn, "worker"))
    try:
        with pytest.raises(asyncpg.PostgresError, match="only the operator role"):
            await worker.execute("UPDATE connector_event SET values_erased_at = now()")
    finally:
        await worker.close()
    operator = await asyncpg.connect(await login_dsn(db_dsn, "operator"))
    try:
        await operator.execute("UPDATE ingress_receipt SET values_erased_at = now()")
    finally:
        await operator.close()
    assert await conn.fetchval("SELECT payload FROM ingress_receipt") == '"connector-push:erased"'
