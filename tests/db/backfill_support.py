"""The demo owner, slot and records the backfill db tests adopt, and what they read back."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from db import records as records_q
from db.records import Conn
from protocol.admission import SaveRequest
from protocol.backfill_facts import RecordDecision, RejectReason
from protocol.identity import link_key
from services.admission import admit_save

R = RejectReason

DEMO_PACK = Path(__file__).resolve().parents[2] / "examples" / "demo-pack.yaml"
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
OWNER, SLOT, DEST = "demo-owner", "push-contact", "remote-contacts"
RID, PROV = "remote_id__c", "remote_provenance__c"
MARKER = f"{OWNER}:{SLOT}:{DEST}"
USER = "alice"
CONTACT = {"Email": "ada@example.com", "FirstName": "Ada", "LastName": "Lovelace"}

Fields = dict[str, Any]


def demo(**slot_changes: Any) -> dict[str, Any]:
    """The demo pack; `slot_changes` override the push-contact slot's keys."""
    document = yaml.safe_load(DEMO_PACK.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    document = copy.deepcopy(document)
    document["actionSlots"][0].update(slot_changes)
    return document


LEGACY_PAIR = {"remoteIdField": "legacy_id__c", "provenanceField": "legacy_prov__c"}


def key_of(record_id: str, slot: str = SLOT) -> str:
    return link_key(OWNER, slot, "Contact", record_id, DEST)


async def put(conn: Conn, record_id: str, fields: Fields, *, deleted: bool = False) -> None:
    await records_q.upsert_record(
        conn, "Contact", record_id, {**CONTACT, **fields}, deleted=deleted
    )


async def grant(conn: Conn, *record_ids: str) -> None:
    await records_q.upsert_object_permission(conn, USER, "Contact", True)
    await records_q.insert_record_permissions(conn, USER, "Contact", list(record_ids))
    await records_q.insert_field_permissions(conn, USER, "Contact", sorted(CONTACT))


async def written(conn: Conn) -> tuple[Any, ...]:
    """Everything adoption could write: links, attempts, PATCHes, record versions."""
    return tuple(
        [
            await conn.fetchval("SELECT count(*) FROM connector_remote_link"),
            await conn.fetchval("SELECT count(*) FROM connector_push_attempt"),
            await conn.fetchval("SELECT count(*) FROM connector_patch_dispatch"),
            await conn.fetch("SELECT record_id, version FROM crm_record ORDER BY record_id"),
        ]
    )


def only(decisions: tuple[RecordDecision, ...], record_id: str) -> RecordDecision:
    [found] = [d for d in decisions if d.record_id == record_id and d.action_slot_id == SLOT]
    return found


async def save(pool: asyncpg.Pool, record_id: str) -> object:
    request = SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=SLOT,
        destination_slot_id=DEST,
        source_object="Contact",
        source_record_id=record_id,
        originating_user_id=USER,
    )
    return await admit_save(
        pool, request, idempotency_key=f"idem-{record_id}", locator_value=record_id, now=NOW
    )
