"""SPEC S-5: beside the declared operator, each audit entry records what the system
knows: the database role and login (filled by Postgres whatever the writer sends), the
client address and the writing process's host."""

from __future__ import annotations

import socket

import asyncpg

from db import audit as q
from protocol.audit import AuditCommand, AuditEntry
from tests.db.roles_support import login_dsn, login_name

ENTRY = AuditEntry(operator="ops", reason="r", command=AuditCommand.RETIRE, outcome="ok")


async def test_s5_postgres_records_the_role_login_and_address_whatever_the_writer_says(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    operator = await asyncpg.connect(await login_dsn(db_dsn, "operator"))
    try:
        await q.append(operator, ENTRY.model_copy(update={"temporal_identity": "1@ui"}))
        # A writer cannot claim another role: the columns are the database's.
        await operator.execute(
            "INSERT INTO connector_operator_audit (operator, reason, command, outcome, "
            "db_role, db_session_user, db_client_addr) "
            "VALUES ('x', 'r', 'retire', 'ok', 'postgres', 'postgres', '10.0.0.1')"
        )
    finally:
        await operator.close()
    first, forged = reversed(await q.entries(conn, None, None, 10))
    assert (first.db_role, first.db_session_user) == (login_name("operator"),) * 2
    assert first.db_client_addr == "127.0.0.1"  # the test server listens on TCP
    assert first.host == socket.gethostname() and first.temporal_identity == "1@ui"
    assert (forged.db_role, forged.db_session_user, forged.db_client_addr) == (
        login_name("operator"),
        login_name("operator"),
        "127.0.0.1",
    )
