"""One creator per record and remote destination, counted at the remote (SPEC G-2).

Issue 47's reproduction 1 (b) as the CRM would send it: a pack (installed before G-2's
apply check) with a second contact slot on a second destination slot addressing the same
remote scope and target object; for each record, two saves through the HTTP save API,
one per slot, sent at once. The remote's ledger is the judge: one contact per record.
"""

from __future__ import annotations

import asyncio
import copy

from sandbox.server import BackgroundSandbox
from services.record_loader import load_records, parse_records_document
from tests.db.batch_admission_support import CONTACT_FIELDS, apply_legacy_pack
from tests.e2e.conftest import OWNER, Stack, demo_manifest
from tests.e2e.save_api_support import AUTH, save_body, save_server
from tests.e2e.support import eventually

RECORDS = 8


def two_creators(base_url: str) -> dict[str, object]:
    document = demo_manifest(base_url)
    slots = document["actionSlots"]
    destinations = document["destinationSlots"]
    assert isinstance(slots, list) and isinstance(destinations, list)
    [dest] = [d for d in destinations if d["id"] == "remote-contacts"]
    destinations.append({**dest, "id": "remote-contacts-2"})
    slots.append({**copy.deepcopy(slots[0]), "id": "push-contact-2"})
    slots[-1]["destinationSlot"] = "remote-contacts-2"
    return document


async def test_g2_concurrent_saves_through_the_api_create_one_contact_per_record(
    stack: Stack, remote: BackgroundSandbox, db_dsn: str
) -> None:
    ids = [f"g2-{n}" for n in range(RECORDS)]
    async with stack.pool.acquire() as conn:
        await apply_legacy_pack(conn, two_creators(remote.url))
        records = [
            {"object": "Contact", "id": i, "fields": {"Email": f"{i}@x.test", "FirstName": i}}
            for i in ids
        ]
        grants = [{"user": "alice", "object": "Contact", "records": "*", "fields": CONTACT_FIELDS}]
        document = {"owner": OWNER, "records": records, "grants": grants}
        await load_records(conn, parse_records_document(document))
    first = {"actionSlot": "push-contact", "destinationSlot": "remote-contacts"}
    second = {"actionSlot": "push-contact-2", "destinationSlot": "remote-contacts-2"}
    async with save_server(db_dsn, temporal=(stack.client, stack.task_queue)) as live:
        for record_id in ids:
            answers = await asyncio.gather(
                *(
                    live.client.post("/v1/saves", json=save_body(record_id, **slot), headers=AUTH)
                    for slot in (first, second)
                )
            )
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            results = [a.json()["result"] for a in answers]
            stack.touched.update(r["linkKey"] for r in results if r.get("linkKey"))
            decisions = sorted(r["decision"] for r in results)
            assert decisions == ["create_reserved", "rejected"], results
            [refused] = [r for r in results if r["decision"] == "rejected"]
            assert refused["reason"] == "prior_ownership_uncertain", refused

    async def finalized() -> int:
        return int(
            await stack.pool.fetchval(
                "SELECT count(*) FROM connector_push_attempt"
                " WHERE connector_owner_key = $1 AND source_record_id LIKE 'g2-%'"
                " AND status = 'finalized'",
                OWNER,
            )
        )

    await eventually(finalized, lambda n: n == RECORDS)
    ledger = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert len(ledger) == RECORDS, ledger
    attempts = await stack.pool.fetch(
        "SELECT source_record_id, count(*) AS n FROM connector_push_attempt"
        " WHERE source_record_id LIKE 'g2-%' GROUP BY source_record_id"
    )
    assert {r["source_record_id"]: r["n"] for r in attempts} == dict.fromkeys(ids, 1)
