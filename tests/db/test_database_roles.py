"""SPEC S-4 least privilege against real Postgres: migration 0220's roles, the owner of
every object, the grant matrix, and what each role cannot do when it logs in."""

from __future__ import annotations

import asyncpg
import pytest

from db import audit as audit_q
from protocol.audit import AuditCommand, AuditEntry
from tests.db.roles_support import APPLICATION_ROLES, Role, group_role, login_dsn

PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
ALL_DML = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})
# Rows that are only ever appended: nobody is granted UPDATE or DELETE (OPS-2, JRN-1, G-8).
APPEND_ONLY = frozenset(
    {
        "connector_operator_audit",
        "connector_link_revalidation_receipt",
        "connector_send_journal",
        "connector_remote_deletion",
        "connector_pack_verification",  # `pack verify` results (0270)
    }
)
INBOX = frozenset({"connector_event", "ingress_receipt", "workflow_action_execution"})
# G-3; an attempt is two rows since migration 0350.
NEVER_DELETED = frozenset(
    {"connector_remote_link", "connector_push_attempt", "connector_push_attempt_request"}
)
# Stored once per content and named by many rows (0350): written by admission, never
# changed or deleted.
CONTENT_ADDRESSED = frozenset({"connector_frozen_snapshot"})
# Every table the migrations make, each with a grant decision below. A new table fails
# this list until its migration grants it and it is added here (fail closed: no grant).
KNOWN_TABLES = frozenset(
    {
        "action_slot_create_path",
        "connector_budget_pace",
        "connector_daily_quota",
        "connector_link_state_count",
        "connector_patch_dispatch",
        "crm_field_permission",
        "crm_object_permission",
        "crm_record",
        "crm_record_permission",
        "pack_install",
        "pack_slot_lineage",
        "save_api_request",
        "schema_migration",
        *APPEND_ONLY,
        *INBOX,
        *NEVER_DELETED,
        *CONTENT_ADDRESSED,
    }
)


def expected(role: Role, table: str) -> frozenset[str]:
    """The table privileges `role` holds on `table` (0220)."""
    if role == "ingress":
        return frozenset({"SELECT", "INSERT"}) if table in INBOX else frozenset()
    if table == "schema_migration":
        return frozenset({"SELECT"})
    if table in CONTENT_ADDRESSED:
        return frozenset({"SELECT", "INSERT"})
    if role == "save_api":
        if table in INBOX:
            return frozenset()
        if table in APPEND_ONLY:
            return frozenset({"SELECT"})
        return frozenset({"SELECT", "INSERT", "UPDATE"})
    if table in APPEND_ONLY:
        return frozenset({"SELECT", "INSERT"})
    if table in NEVER_DELETED:
        return frozenset({"SELECT", "INSERT", "UPDATE"})
    return ALL_DML


async def _tables(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
        "AND relkind IN ('r', 'p')"
    )
    return {r["relname"] for r in rows}


async def test_s4_the_migrations_create_one_nologin_role_per_process(
    conn: asyncpg.Connection,
) -> None:
    rows = await conn.fetch(
        "SELECT rolname, rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls "
        "FROM pg_roles WHERE rolname LIKE 'connector\\_push\\_%' ORDER BY rolname"
    )
    assert [r["rolname"] for r in rows] == sorted(
        group_role(r) for r in ("migrator", *APPLICATION_ROLES)
    )
    assert not any(any(tuple(r)[1:]) for r in rows), "a group role with a power it must not have"


async def test_s4_no_application_role_owns_a_table_or_a_function(
    conn: asyncpg.Connection,
) -> None:
    owners = await conn.fetch(
        """
        SELECT c.relname AS name, pg_get_userbyid(c.relowner) AS owner FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
        UNION ALL
        SELECT p.proname, pg_get_userbyid(p.proowner) FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
        """
    )
    assert owners
    wrong = {r["name"]: r["owner"] for r in owners if r["owner"] != "connector_push_migrator"}
    assert wrong == {}


async def test_s4_every_table_has_the_declared_grants(conn: asyncpg.Connection) -> None:
    tables = await _tables(conn)
    assert tables == KNOWN_TABLES, "a new table needs its grants (a migration) and a row here"
    for role in APPLICATION_ROLES:
        for table in sorted(tables):
            held = {
                p
                for p in PRIVILEGES
                if await conn.fetchval(
                    "SELECT has_table_privilege($1, $2, $3)", group_role(role), table, p
                )
            }
            assert held == expected(role, table), (role, table)


@pytest.mark.parametrize(
    ("role", "table", "column", "granted"),
    [
        ("worker", "connector_send_journal", "outcome", True),
        ("worker", "connector_send_journal", "method", False),
        ("operator", "connector_send_journal", "outcome", False),
        ("ingress", "connector_event", "workflow_started_at", True),
        ("ingress", "connector_event", "payload", False),
        ("ingress", "workflow_action_execution", "workflow_started_at", True),
        ("ingress", "workflow_action_execution", "phase", False),
    ],
)
async def test_s4_column_grants(
    conn: asyncpg.Connection, role: Role, table: str, column: str, granted: bool
) -> None:
    held = await conn.fetchval(
        "SELECT has_column_privilege($1, $2, $3, 'UPDATE')", group_role(role), table, column
    )
    assert held is granted


async def _refused(dsn: str, role: Role, statements: tuple[str, ...]) -> list[str]:
    """The statements Postgres lets `role` run (each in its own implicit transaction)."""
    connection = await asyncpg.connect(await login_dsn(dsn, role))
    allowed = []
    try:
        for statement in statements:
            try:
                await connection.execute(statement)
            except asyncpg.InsufficientPrivilegeError:
                continue
            allowed.append(statement)
    finally:
        await connection.close()
    return allowed


UNGUARDING = (
    "UPDATE connector_operator_audit SET reason = 'rewritten'",
    "DELETE FROM connector_operator_audit",
    "TRUNCATE connector_operator_audit",
    "ALTER TABLE connector_operator_audit DISABLE TRIGGER ALL",
    "DROP TRIGGER connector_operator_audit_append_only_tg ON connector_operator_audit",
    "ALTER TABLE connector_send_journal DISABLE TRIGGER connector_send_journal_guard_tg",
    "UPDATE connector_send_journal SET method = 'GET'",
    "DELETE FROM connector_send_journal",
    "TRUNCATE connector_send_journal",
    "ALTER TABLE connector_push_attempt DISABLE TRIGGER connector_push_attempt_evidence_tg",
    "DROP TABLE connector_operator_audit",
)


@pytest.mark.parametrize("role", APPLICATION_ROLES)
async def test_s4_no_application_role_can_rewrite_or_unguard_the_evidence(
    conn: asyncpg.Connection, db_dsn: str, role: Role
) -> None:
    await audit_q.append(conn, AuditEntry(
        operator="ops", reason="r", command=AuditCommand.RETIRE, outcome="ok"))  # fmt: skip
    assert await _refused(db_dsn, role, UNGUARDING) == []
    assert await conn.fetchval("SELECT reason FROM connector_operator_audit") == "r"


INGRESS_FORBIDDEN = (
    "SELECT count(*) FROM connector_remote_link",
    "SELECT count(*) FROM connector_push_attempt",
    "SELECT count(*) FROM connector_patch_dispatch",
    "SELECT count(*) FROM connector_send_journal",
    "SELECT count(*) FROM connector_operator_audit",
    "SELECT count(*) FROM crm_record",
    "SELECT count(*) FROM save_api_request",
    "UPDATE connector_push_attempt SET last_error = 'x'",
    "UPDATE connector_remote_link SET suspend_reason = 'x'",
    "INSERT INTO connector_operator_audit (operator, reason, command, outcome) "
    "VALUES ('ingress', 'r', 'retire', 'ok')",
    "UPDATE connector_event SET payload = '{}'",
    "DELETE FROM connector_event",
    "DELETE FROM ingress_receipt",
)


async def test_s4_the_ingress_role_cannot_touch_links_attempts_or_the_audit_trail(
    db_dsn: str,
) -> None:
    assert await _refused(db_dsn, "ingress", INGRESS_FORBIDDEN) == []
