"""The local record store (PACK-3) and its loader against a real, migrated database."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from protocol.authority import PermissionFacts
from services.record_loader import load_records, parse_records_document
from services.record_store import PostgresRecordStore

MIRROR = {"hs_remote_id": None, "hs_provenance": None}

DOCUMENT: dict[str, Any] = {
    "records": [
        {
            "object": "contact",
            "id": "c-1",
            "fields": {"email": "ada@example.com", "phone": "+1 555 0100", "age": 36},
        },
        {"object": "contact", "id": "c-2", "fields": {"email": "bob@example.com"}},
        {
            "object": "contact",
            "id": "c-gone",
            "fields": {"email": "x@example.com"},
            "deleted": True,
        },
    ],
    "grants": [
        {"user": "alice", "object": "contact", "records": "*", "fields": ["age", "email", "phone"]},
        {"user": "bob", "object": "contact", "records": ["c-2"], "fields": ["age", "email"]},
        {"user": "mallory", "object": "contact", "objectRead": False, "records": "*"},
    ],
}


@pytest.fixture
async def store(db_pool: asyncpg.Pool) -> PostgresRecordStore:
    async with db_pool.acquire() as conn:
        await load_records(conn, parse_records_document(DOCUMENT))
    return PostgresRecordStore(db_pool)


async def test_read_record_returns_fields_and_version(store: PostgresRecordStore) -> None:
    record = await store.read_record("contact", "c-1")
    assert record is not None
    assert record.fields == {"email": "ada@example.com", "phone": "+1 555 0100", "age": 36}
    assert (record.version, record.deleted) == (1, False)
    assert await store.read_record("contact", "c-404") is None
    assert await store.read_record("company", "c-1") is None


async def test_deleted_record_is_readable_but_does_not_exist(store: PostgresRecordStore) -> None:
    gone = await store.read_record("contact", "c-gone")
    assert gone is not None and gone.deleted
    assert await store.exists("contact", "c-1")
    assert not await store.exists("contact", "c-gone")
    assert not await store.exists("contact", "c-404")


async def test_permissions_differ_by_user(store: PostgresRecordStore) -> None:
    alice = await store.read_permissions("alice", "contact", "c-1")
    assert alice == PermissionFacts(
        object_readable=True,
        record_readable=True,
        readable_fields=frozenset({"age", "email", "phone"}),
    )
    bob = await store.read_permissions("bob", "contact", "c-2")
    assert (bob.object_readable, bob.record_readable) == (True, True)
    assert bob.readable_fields == frozenset({"age", "email"})


async def test_ungranted_record_object_and_user_are_unreadable(store: PostgresRecordStore) -> None:
    bob_other = await store.read_permissions("bob", "contact", "c-1")
    assert (bob_other.object_readable, bob_other.record_readable) == (True, False)
    mallory = await store.read_permissions("mallory", "contact", "c-1")
    assert (mallory.object_readable, mallory.record_readable) == (False, True)
    stranger = await store.read_permissions("eve", "contact", "c-1")
    assert stranger == PermissionFacts(
        object_readable=False, record_readable=False, readable_fields=frozenset()
    )
    wrong_object = await store.read_permissions("alice", "company", "c-1")
    assert not wrong_object.object_readable and not wrong_object.readable_fields


async def test_mirror_cas_writes_when_expected_values_hold(store: PostgresRecordStore) -> None:
    new = {"hs_remote_id": "901", "hs_provenance": "lk1_abc"}
    assert await store.compare_and_set_mirror("contact", "c-1", MIRROR, new)
    record = await store.read_record("contact", "c-1")
    assert record is not None
    assert record.version == 2
    assert record.fields["hs_remote_id"] == "901"
    assert record.fields["email"] == "ada@example.com"


async def test_mirror_cas_with_stale_expected_value_changes_nothing(
    store: PostgresRecordStore,
) -> None:
    first = {"hs_remote_id": "901", "hs_provenance": "lk1_abc"}
    assert await store.compare_and_set_mirror("contact", "c-1", MIRROR, first)
    before = await store.read_record("contact", "c-1")

    stale = await store.compare_and_set_mirror(
        "contact", "c-1", MIRROR, {"hs_remote_id": "902", "hs_provenance": "lk1_def"}
    )

    assert stale is False
    assert await store.read_record("contact", "c-1") == before


async def test_mirror_cas_partial_mismatch_changes_nothing(store: PostgresRecordStore) -> None:
    expected = {"hs_remote_id": None, "email": "someone-else@example.com"}
    assert not await store.compare_and_set_mirror(
        "contact", "c-1", expected, {"hs_remote_id": "903"}
    )
    record = await store.read_record("contact", "c-1")
    assert record is not None
    assert "hs_remote_id" not in record.fields and record.version == 1


async def test_mirror_cas_expected_none_matches_json_null(store: PostgresRecordStore) -> None:
    assert await store.compare_and_set_mirror(
        "contact", "c-2", {"hs_remote_id": None}, {"hs_remote_id": None}
    )
    assert await store.compare_and_set_mirror(
        "contact", "c-2", {"hs_remote_id": None}, {"hs_remote_id": "904"}
    )


async def test_mirror_cas_never_writes_deleted_or_missing_records(
    store: PostgresRecordStore,
) -> None:
    new = {"hs_remote_id": "905", "hs_provenance": "lk1_abc"}
    assert not await store.compare_and_set_mirror("contact", "c-gone", MIRROR, new)
    assert not await store.compare_and_set_mirror("contact", "c-404", MIRROR, new)
    gone = await store.read_record("contact", "c-gone")
    assert gone is not None and "hs_remote_id" not in gone.fields


async def test_mirror_cas_refuses_unguarded_fields(store: PostgresRecordStore) -> None:
    with pytest.raises(ValueError, match="hs_provenance"):
        await store.compare_and_set_mirror(
            "contact", "c-1", {"hs_remote_id": None}, {"hs_remote_id": "1", "hs_provenance": "p"}
        )


async def test_store_on_a_connection_joins_the_callers_transaction(
    db_pool: asyncpg.Pool, store: PostgresRecordStore
) -> None:
    async with db_pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        on_conn = PostgresRecordStore(conn)
        assert await on_conn.compare_and_set_mirror("contact", "c-1", MIRROR, {"hs_remote_id": "9"})
        await tx.rollback()
    record = await store.read_record("contact", "c-1")
    assert record is not None and "hs_remote_id" not in record.fields


async def test_reload_is_a_no_op_and_keeps_written_back_fields(
    db_pool: asyncpg.Pool, store: PostgresRecordStore
) -> None:
    assert await store.compare_and_set_mirror("contact", "c-1", MIRROR, {"hs_remote_id": "7"})
    async with db_pool.acquire() as conn:
        summary = await load_records(conn, parse_records_document(DOCUMENT))
    assert (summary.records_written, summary.records_unchanged) == (0, 3)
    record = await store.read_record("contact", "c-1")
    assert record is not None
    assert (record.version, record.fields["hs_remote_id"]) == (2, "7")


async def test_changed_record_bumps_version_and_grants_are_replaced(
    db_pool: asyncpg.Pool, store: PostgresRecordStore
) -> None:
    changed = {
        "records": [{"object": "contact", "id": "c-1", "fields": {"phone": "+1 555 0199"}}],
        "grants": [{"user": "alice", "object": "contact", "records": ["c-2"], "fields": ["email"]}],
    }
    async with db_pool.acquire() as conn:
        summary = await load_records(conn, parse_records_document(changed))
    assert summary.records_written == 1
    record = await store.read_record("contact", "c-1")
    assert record is not None
    assert (record.version, record.fields["phone"], record.fields["age"]) == (2, "+1 555 0199", 36)
    alice = await store.read_permissions("alice", "contact", "c-1")
    assert not alice.record_readable
    assert alice.readable_fields == frozenset({"email"})
