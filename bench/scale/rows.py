"""Rows in bulk, in the shapes the product writes, inserted by COPY with every trigger and
constraint in force.

- links: `bench.revalidation_bench.seed` (P4's): copies of a link the product itself
  finalized from an admitted attempt, each with its own record id, key and remote id;
- contacts for `push --all`: `crm_record` rows by COPY (the record store has no
  trigger), then the read grant through the product's own loader (`records: "*"` is
  one set-wise INSERT of a permission row per record);
- legacy contacts for `backfill`: the same records carrying the demo slot's mirror pair,
  a remote id and the legacy provenance marker `owner:slot:destination` (MIG-1).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Final

import asyncpg

from bench.revalidation_bench import ACTION, DESTINATION, OBJECT, OWNER, _pack, log
from bench.stack import FIELDS
from protocol.identity import link_key
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document

USER: Final = "bench"
MARKER: Final = f"{OWNER}:{ACTION}:{DESTINATION}"
RECORD_COLUMNS: Final = ("source_object", "record_id", "fields")


def record_id(i: int) -> str:
    return f"sc-{i:07d}"


def key_of(i: int) -> str:
    return link_key(OWNER, ACTION, OBJECT, record_id(i), DESTINATION)


def _records(n: int, legacy: bool) -> Iterator[tuple[str, str, str]]:
    for i in range(n):
        fields: dict[str, str] = {"Email": f"s{i}@example.com", "FirstName": "Scale"}
        fields["LastName"] = f"N{i}"
        if legacy:
            fields |= {"remote_id__c": f"legacy-{i}", "remote_provenance__c": MARKER}
        yield OBJECT, record_id(i), json.dumps(fields)


async def contacts(conn: asyncpg.Connection, n: int, *, legacy: bool) -> None:
    """The demo pack, then `n` Contact records (with mirror evidence when `legacy`)."""
    await apply_pack(conn, _pack(drop_phone=False))
    started = time.monotonic()
    await conn.copy_records_to_table(
        "crm_record", columns=list(RECORD_COLUMNS), records=_records(n, legacy)
    )
    if not legacy:  # push admits on the user's read authority (WF-2)
        grant = {"user": USER, "object": OBJECT, "records": "*", "fields": FIELDS}
        await load_records(conn, parse_records_document({"records": [], "grants": [grant]}))
    await conn.execute("ANALYZE")
    kind = "legacy records" if legacy else "records and their grants"
    log(f"scale: {n:,} {kind} inserted by COPY in {time.monotonic() - started:.1f} s")
