"""Contacts in bulk for the initial-sync tests (issue 34 item 2): `n` live records alice
may read, each with an Email, so every one is admitted as a create."""

from __future__ import annotations

from db.records import Conn
from services.record_loader import load_records, parse_records_document

CONTACT_FIELDS = ["FirstName", "LastName", "Email", "Phone", "remote_id__c", "remote_provenance__c"]


def bulk_ids(n: int, prefix: str = "cb") -> list[str]:
    return [f"{prefix}-{i:05}" for i in range(n)]


async def load_bulk_contacts(conn: Conn, n: int, prefix: str = "cb") -> list[str]:
    ids = bulk_ids(n, prefix)
    records = [
        {"object": "Contact", "id": r, "fields": {"FirstName": "B", "Email": f"{r}@x.test"}}
        for r in ids
    ]
    grants = [{"user": "alice", "object": "Contact", "records": "*", "fields": CONTACT_FIELDS}]
    # The demo pack's owner: the save API saves a record only for its owner (S-1).
    document = {"owner": "demo-owner", "records": records, "grants": grants}
    await load_records(conn, parse_records_document(document))
    return ids
