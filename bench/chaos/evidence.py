"""What the checker trusts: the sandbox ledger and the SQL rows, and how they are joined.

A ledger create is traced to the attempt that sent it by the attempt's
idempotency key (header sent), its locator (a unique value stored), or the hash
of its frozen body (the exact bytes sent; bodies are unique per record, see
`world`). A ledger PATCH is traced to its link by object id and to its PATCH row
by body hash.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from protocol.request import wire_body
from sandbox.state import LedgerEntry

ATTEMPTS_SQL = """
SELECT attempt_id::text AS attempt_id, link_key, status, attempt_ordinal, dispatch_lane,
       remote_io_started_at IS NOT NULL AS started, request_idempotency_key,
       EXISTS (SELECT 1 FROM connector_send_journal j
               WHERE j.attempt_id = a.attempt_id
                 AND j.kind = 'send'
             AND send_try_may_have_landed('create', j.outcome, j.status,
                                              j.not_applied_statuses)) AS journal_possible,
       request_snapshot->>'locator_value' AS locator, request_snapshot->>'body_hash' AS body_hash,
       response_snapshot, remote_id, last_error, source_object, source_record_id, created_at
FROM connector_push_attempt a JOIN connector_push_attempt_frozen USING (attempt_id)
"""
LINKS_SQL = """
SELECT link_key, status, suspend_reason, remote_id, target_object, source_object,
       source_record_id, mirror_remote_id_field
FROM connector_remote_link
"""
PATCHES_SQL = """
SELECT patch_id::text AS patch_id, link_key, status, remote_io_started_at IS NOT NULL AS started,
       EXISTS (SELECT 1 FROM connector_send_journal j
               WHERE j.patch_id = p.patch_id
                 AND j.kind = 'send'
             AND send_try_may_have_landed('patch', j.outcome, j.status,
                                              j.not_applied_statuses)) AS journal_possible,
       ARRAY(SELECT j.sending_at FROM connector_send_journal j
             WHERE j.patch_id = p.patch_id AND j.kind = 'send') AS send_times,
       body, response_snapshot, last_error, created_at
FROM connector_patch_dispatch p ORDER BY created_at, patch_id
"""
RECORDS_SQL = "SELECT source_object, record_id, fields FROM crm_record"


def _ledger_time(at: str) -> datetime:
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


def body_sha256(body: Any) -> str | None:
    if body is None:
        return None
    value = json.loads(body) if isinstance(body, str) else body
    return hashlib.sha256(wire_body(value)).hexdigest()


@dataclass
class Evidence:
    """One snapshot of the ledger and the rows, with the joins the checks need."""

    ledger: list[LedgerEntry]
    attempts: list[dict[str, Any]]
    links: dict[str, dict[str, Any]]
    patches: list[dict[str, Any]]
    records: dict[tuple[str, str], dict[str, Any]]
    objects: dict[str, set[str]]  # object type -> ids present in the sandbox
    creates_of: dict[str, list[LedgerEntry]] = field(default_factory=dict)  # attempt id ->
    unattributed: list[LedgerEntry] = field(default_factory=list)
    patch_entries_of: dict[str, list[LedgerEntry]] = field(default_factory=dict)  # patch id ->
    foreign_patches: dict[str, list[LedgerEntry]] = field(default_factory=dict)  # link key ->
    pruned_patches: list[LedgerEntry] = field(default_factory=list)  # sent by a pruned row

    def __post_init__(self) -> None:
        self._join_creates()
        self._join_patches()

    def attempts_by_key(self) -> dict[str, list[dict[str, Any]]]:
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in sorted(self.attempts, key=lambda r: int(r["attempt_ordinal"])):
            grouped[row["link_key"]].append(row)
        return grouped

    def patches_by_key(self) -> dict[str, list[dict[str, Any]]]:
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.patches:
            grouped[row["link_key"]].append(row)
        return grouped

    def created_objects(self, link_key: str) -> set[str]:
        """Distinct remote objects created (not replayed) by any attempt of the link key."""
        return {
            str(e.object_id)
            for a in self.attempts
            if a["link_key"] == link_key
            for e in self.creates_of.get(a["attempt_id"], [])
            if not e.replayed
        }

    def _join_creates(self) -> None:
        index: dict[str, set[str]] = defaultdict(set)
        for a in self.attempts:
            for value in (a["request_idempotency_key"], a["locator"], a["body_hash"]):
                if value:
                    index[value].add(a["attempt_id"])
        for entry in self.ledger:
            if entry.kind != "create":
                continue
            owners = self._owners(entry, index)
            if not owners:
                self.unattributed.append(entry)
            for attempt_id in owners:
                self.creates_of.setdefault(attempt_id, []).append(entry)

    def _owners(self, entry: LedgerEntry, index: dict[str, set[str]]) -> set[str]:
        """The strongest match wins: the idempotency key sent, then a unique locator value,
        then the body's hash. Attempts of one link freeze the same body when the record did
        not change in between (a supersede): the body then names the newest attempt that
        existed when the remote applied the create."""
        for keys in ([entry.idempotency_key], list(entry.unique_values.values())):
            found = set().union(*(index.get(k, set()) for k in keys if k))
            if found:
                return found
        found = index.get(entry.body_sha256, set())
        rows = [a for a in self.attempts if a["attempt_id"] in found]
        if len({a["link_key"] for a in rows}) != 1 or len(rows) == 1:
            return set(found)
        applied = _ledger_time(entry.at)
        earlier = [a for a in rows if a.get("created_at") is None or a["created_at"] <= applied]
        newest = max(earlier or rows, key=lambda a: a["attempt_ordinal"])
        return {newest["attempt_id"]}

    def _join_patches(self) -> None:
        by_object = {(v["target_object"], v["remote_id"]): k for k, v in self.links.items()}
        hashes: dict[tuple[str, str | None], list[dict[str, Any]]] = defaultdict(list)
        for p in self.patches:  # ordered by created_at
            hashes[(p["link_key"], body_sha256(p["body"]))].append(p)
        for entry in self.ledger:
            if entry.kind != "patch":
                continue
            key = by_object.get((entry.object_type, entry.object_id))
            if key is None:
                continue
            rows = hashes.get((key, entry.body_sha256), [])
            if not rows:
                self.foreign_patches.setdefault(key, []).append(entry)
                continue
            owner = _patch_owner(rows, _ledger_time(entry.at))
            if owner is None:
                self.pruned_patches.append(entry)
            else:
                self.patch_entries_of.setdefault(owner["patch_id"], []).append(entry)


def _patch_owner(rows: list[dict[str, Any]], applied: datetime) -> dict[str, Any] | None:
    """Which of a link's PATCHes with one body the remote applied at `applied`.

    Two PATCHes of one link freeze the same body when a save changed nothing the mapping
    sends, or the record went back to earlier values; a PATCH row is queued at save time,
    so a later one may exist, unsent, when the earlier one lands. The owner is the PATCH
    whose journalled try went out last before the remote applied it (each try's
    `sending_at` is taken in the gate's transaction, before the request leaves); a ledger
    entry no journalled try precedes names the newest row that existed then with no
    journalled try at all (a send its journal lacks), and the checks report what that row
    says. A row whose every journalled try went out after the entry did not send it. None:
    no row could have, so a PATCH since pruned (a settled one, OPS-3) sent it."""
    sent = [
        (max(t for t in p["send_times"] if t <= applied), p)
        for p in rows
        if any(t <= applied for t in p.get("send_times") or ())
    ]
    if sent:
        return max(sent, key=lambda pair: pair[0])[1]
    earlier = [
        p
        for p in rows
        if not p.get("send_times") and (p["created_at"] is None or p["created_at"] <= applied)
    ]
    return earlier[-1] if earlier else None


async def read_rows(dsn: str) -> tuple[list[dict[str, Any]], ...]:
    conn = await asyncpg.connect(dsn)
    try:
        results = []
        for sql in (ATTEMPTS_SQL, LINKS_SQL, PATCHES_SQL, RECORDS_SQL):
            results.append([dict(r) for r in await conn.fetch(sql)])
        return tuple(results)
    finally:
        await conn.close()


def build_evidence(
    ledger: list[LedgerEntry],
    rows: tuple[list[dict[str, Any]], ...],
    objects: dict[str, set[str]],
) -> Evidence:
    attempts, links, patches, records = rows
    fields = {
        (r["source_object"], r["record_id"]): json.loads(r["fields"])
        if isinstance(r["fields"], str)
        else r["fields"]
        for r in records
    }
    return Evidence(
        ledger=ledger,
        attempts=attempts,
        links={row["link_key"]: row for row in links},
        patches=patches,
        records=fields,
        objects=objects,
    )
