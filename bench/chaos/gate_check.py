"""The side paths' invariants, from the pack history and the request log in the database
(and the sandbox ledger, through `Evidence`), with the pure rules of `protocol/`:

1. no request sent against a fail-closed finding: every journalled request (a try passed
   its gate, G-1) is judged again with the drift matrix (`protocol.drift.classify`) and
   the G-1 table, against each install that could have been active when it was gated;
   all of them refusing is a violation. The gate module itself is not called, so a
   gate switched off is caught rather than agreed with. A
   create is judged with its frozen attempt, a PATCH or read-back by C-4 (the link must
   have been validated under that install: its creation or a revalidation receipt);
2. at most one remote object per record and remote destination across action slots,
   unless the pack declares the two slots separate (G-2);
3. every parked link's remedy (`protocol.park.remedy_for`) names, first, an action the
   guards accept in the state the link is in (G-6, C-9);
4. no finalized link under an action slot the active pack lacks (C-9, G-4).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from bench.chaos.evidence import Evidence
from protocol.active import ActiveMetadata, resolve_active
from protocol.audit import AuditCommand
from protocol.drift import INSTALL_SURFACES, Disposition, Finding, classify
from protocol.manifest import PackManifest, parse_manifest
from protocol.operator import OperatorAction
from protocol.park import remedy_for, suspended_reason
from protocol.park_reason import ParkReason
from protocol.send_gate import ROUTE_SURFACES, KeyAge, RequestKind
from services.create.gate import frozen_key_retention
from services.rows import attempt_snapshot, request_of

# A request's gate ran in its claim transaction, whose `now()` (the journal's sending_at)
# may precede by this much the read of an install or receipt committed meanwhile.
GRACE = timedelta(seconds=3)
# An install's `activated_at` is its apply transaction's start; the apply commits later (it
# suspends links, waiting on their row locks): seed 503 had POSTs 3.4 s after a slot-removing
# apply's start gated under the install before it. Commit times are not recorded, so the
# install before stays a candidate this long after the next one's start.
LATE_COMMIT = timedelta(seconds=10)
KEY_AGE_SLACK_S = 2.0  # the gate's clock is the worker's, the journal's Postgres'

INSTALLS_SQL = """
SELECT pack_install_id::text AS id, previous_pack_install_id::text AS previous,
       manifest::text AS manifest, activated_at, deactivated_at
FROM pack_install WHERE activated_at IS NOT NULL ORDER BY activated_at
"""
JOURNAL_SQL = """
SELECT journal_id, attempt_id::text AS attempt_id, patch_id::text AS patch_id, kind,
       sending_at, outcome, status, not_applied_statuses
FROM connector_send_journal ORDER BY journal_id
"""
ATTEMPT_ROWS_SQL = (
    "SELECT * FROM connector_push_attempt JOIN connector_push_attempt_frozen USING (attempt_id)"
)
PATCH_LINKS_SQL = "SELECT patch_id::text AS patch_id, link_key FROM connector_patch_dispatch"
LINK_ORIGINS_SQL = """
SELECT link_key, created_pack_install_id::text AS created, action_slot_id, destination_slot_id
FROM connector_remote_link
"""
RECEIPTS_SQL = """
SELECT link_key, new_pack_install_id::text AS install, created_at
FROM connector_link_revalidation_receipt
"""
# The operator actions that leave a link validated under the install active when they ran
# (protocol.restore_rule): the audit is appended only when the action committed (OPS-2).
RESTORES_SQL = """
SELECT link_key, recorded_at FROM connector_operator_audit
WHERE link_key IS NOT NULL AND command = ANY($1::text[])
"""
RESTORE_COMMANDS = (
    AuditCommand.RECONCILE.value,
    AuditCommand.REVALIDATE_LINK.value,
    AuditCommand.REVALIDATE_OWNER.value,
)


@dataclass(frozen=True)
class Install:
    id: str
    manifest: PackManifest
    activated_at: datetime
    deactivated_at: datetime | None
    ancestors: frozenset[str]

    def active_near(self, at: datetime) -> bool:
        end = self.deactivated_at
        return self.activated_at <= at + GRACE and (end is None or end >= at - LATE_COMMIT)


@dataclass
class History:
    """The pack history and the request log, read once after the settle phase."""

    installs: list[Install]
    journal: list[dict[str, Any]]
    attempts: dict[str, dict[str, Any]]
    patch_links: dict[str, str]
    links: dict[str, dict[str, Any]]
    validated: dict[str, list[tuple[str, datetime | None]]]  # link key -> (install, when)
    restored: dict[str, list[datetime]]  # link key -> when an operator action validated it

    @property
    def active(self) -> Install | None:
        return next((i for i in self.installs if i.deactivated_at is None), None)

    def near(self, at: datetime) -> list[Install]:
        return [i for i in self.installs if i.active_near(at)]


async def read_history(dsn: str) -> History:
    conn = await asyncpg.connect(dsn)
    try:
        rows = [[dict(r) for r in await conn.fetch(sql)] for sql in _HISTORY_SQL]
        restores = [dict(r) for r in await conn.fetch(RESTORES_SQL, list(RESTORE_COMMANDS))]
    finally:
        await conn.close()
    return history_of(*rows, restores)


_HISTORY_SQL = (
    INSTALLS_SQL,
    JOURNAL_SQL,
    ATTEMPT_ROWS_SQL,
    PATCH_LINKS_SQL,
    LINK_ORIGINS_SQL,
    RECEIPTS_SQL,
)


def history_of(*rows: list[dict[str, Any]]) -> History:
    installs, journal, attempts, patches, links, receipts, restores = rows
    previous = {r["id"]: r["previous"] for r in installs}
    validated: dict[str, list[tuple[str, datetime | None]]] = defaultdict(list)
    for r in receipts:
        validated[r["link_key"]].append((r["install"], r["created_at"]))
    for a in attempts:
        # A link is finalized under the install its succeeding attempt froze (a supersede's
        # attempt may freeze a newer one than the link's creation): a PATCH follows it.
        if a["status"] == "succeeded":
            validated[a["link_key"]].append((str(a["pack_install_id"]), None))
    restored: dict[str, list[datetime]] = defaultdict(list)
    for r in restores:
        restored[r["link_key"]].append(r["recorded_at"])
    return History(
        installs=[
            Install(
                r["id"],
                parse_manifest(json.loads(r["manifest"])),
                r["activated_at"],
                r["deactivated_at"],
                frozenset(_ancestors(r["id"], previous)),
            )
            for r in installs
        ],
        journal=journal,
        attempts={str(a["attempt_id"]): a for a in attempts},
        patch_links={p["patch_id"]: p["link_key"] for p in patches},
        links={link["link_key"]: link for link in links},
        validated=validated,
        restored=restored,
    )


def _ancestors(install: str, previous: dict[str, str | None]) -> Iterator[str]:
    at = previous.get(install)
    while at is not None:
        yield at
        at = previous.get(at)


def violation(kind: str, key: str | None, detail: str) -> dict[str, object]:
    return {"kind": kind, "link_key": key, "detail": detail}


def _may_have_landed(row: dict[str, Any]) -> bool:
    if row["kind"] != "send" or row["outcome"] == "not_sent":
        return False
    return not (row["outcome"] == "answered" and row["status"] in row["not_applied_statuses"])


def sent_past_fail_closed(h: History) -> Iterator[dict[str, object]]:
    """Check 1, for every journalled request."""
    earlier: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in h.journal:
        if row["attempt_id"]:
            found = _create_refused(h, row, earlier[row["attempt_id"]])
            earlier[row["attempt_id"]].append(row)
            key = h.attempts[row["attempt_id"]]["link_key"]
        else:
            key = h.patch_links.get(row["patch_id"], "")
            found = _patch_refused(h, key, row["sending_at"])
        if found:
            yield violation(
                "sent_past_fail_closed",
                key,
                f"{row['kind']} journal #{row['journal_id']} at {row['sending_at']:%H:%M:%S.%f}"
                f" ({row['outcome']}): {found}",
            )


def _create_refused(h: History, row: dict[str, Any], before: list[dict[str, Any]]) -> str:
    attempt = h.attempts[row["attempt_id"]]
    frozen = attempt_snapshot(attempt)  # type: ignore[arg-type]  # a row as a dict
    at: datetime = row["sending_at"]
    if row["kind"] == "lookup":
        kind = RequestKind.LOOKUP
    elif any(_may_have_landed(r) for r in before):
        kind = RequestKind.CREATE_RESEND
    else:
        kind = RequestKind.CREATE_FIRST
    first = next((r["sending_at"] for r in before), at)
    age = KeyAge(
        age_seconds=max(0.0, (at - first).total_seconds() - KEY_AGE_SLACK_S),
        retention_seconds=frozen_key_retention(request_of(attempt)),  # type: ignore[arg-type]
    )
    details = []
    candidates: list[Install | None] = [*h.near(at)] or [None]
    for install in candidates:
        active = _active(install, attempt["action_slot_id"], attempt["destination_slot_id"])
        blocking = [f for f in classify(frozen, active) if _blocks(kind, f)]
        if kind is RequestKind.CREATE_RESEND and age.lapsed:
            details.append(f"re-sent on a key {age.age_seconds:.0f} s old (G-5)")
        elif blocking:
            found = ", ".join(f.surface.value for f in blocking)
            details.append(f"{kind.value} under {install and install.id}: {found}")
        else:
            return ""
    return "; ".join(details)


def _blocks(kind: RequestKind, finding: Finding) -> bool:
    """The G-1 table: a GET is refused by a route surface only (a new install among them);
    any other request by any fail-closed finding."""
    if kind is RequestKind.LOOKUP:
        return finding.surface in ROUTE_SURFACES and (
            finding.surface in INSTALL_SURFACES or finding.disposition is Disposition.FAIL_CLOSED
        )
    return finding.disposition is Disposition.FAIL_CLOSED


def slot_problem(active: ActiveMetadata) -> str | None:
    """What the active install lacks of a link's two slots (C-9), or None."""
    if active.action is None or active.destination is None:
        return f"slot {active.action_slot_id!r} or {active.destination_slot_id!r} is not active"
    return None


def _active(install: Install | None, action: str, destination: str) -> ActiveMetadata | None:
    if install is None:
        return None
    return resolve_active(
        install.manifest, install.id, action, destination, install_ancestors=install.ancestors
    )


def _patch_refused(h: History, key: str, at: datetime) -> str:
    """C-4 (drift matrix, finalized-link column: `pack_upgraded`/`pack_install` fail
    closed): a PATCH or read-back goes only under an install the link was validated for."""
    link = h.links.get(key)
    if link is None:
        return ""
    validations = [(link["created"], None), *h.validated.get(key, [])]
    validations += [(i.id, w) for w in h.restored.get(key, []) for i in h.near(w)]
    candidates = h.near(at)
    for install in candidates:
        if any(i == install.id and (w is None or w <= at + GRACE) for i, w in validations):
            return ""
    names = [i.id for i in candidates]
    return f"the link was validated under none of the installs active then ({names}) (C-4)"


def two_creators(ev: Evidence, h: History) -> Iterator[dict[str, object]]:
    """Check 2: remote objects per (record, remote scope, target object) across slots."""
    separate = {pair for i in h.installs for pair in i.manifest.separate_pairs()}
    owners: dict[tuple[str, ...], dict[str, set[str]]] = defaultdict(dict)
    for a in h.attempts.values():
        request = request_of(a)  # type: ignore[arg-type]
        where = (
            a["source_object"],
            a["source_record_id"],
            request.remote_scope,
            a["target_object"],
        )
        owners[where].setdefault(a["action_slot_id"], set()).update(
            ev.created_objects(a["link_key"])
        )
    for place, by_slot in sorted(owners.items()):
        creators = {slot: ids for slot, ids in by_slot.items() if ids}
        if len(creators) < 2 or frozenset(creators) in separate:
            continue
        objects = sorted(set().union(*creators.values()))
        yield violation(
            "two_creators_one_destination",
            None,
            f"record {place[:2]} owns {objects} at {place[2:]} under slots {sorted(creators)}",
        )


def _accepted(action: OperatorAction | None, link: dict[str, Any] | None, h: History) -> bool:
    """Would the guards take this update now? (None: the remedy is a new save.)"""
    if action in (OperatorAction.RETIRE, OperatorAction.RECONCILE, OperatorAction.SUPERSEDE):
        return True  # their own guards are the C-1 checks of checker.py
    active = h.active
    if link is None or active is None:
        return False
    resolved = _active(active, link["action_slot_id"], link["destination_slot_id"])
    return resolved is not None and slot_problem(resolved) is None


def parked_without_exit(
    ev: Evidence, h: History, parked: Iterable[str]
) -> Iterator[dict[str, object]]:
    """Check 3, for the links the campaign ended with parked."""
    for key in sorted(parked):
        attempts = ev.attempts_by_key().get(key, [])
        link, row = h.links.get(key), ev.links.get(key)
        status = attempts[-1]["status"] if attempts else None
        if status in ("ambiguous_remote_effect", "terminal_failed"):
            reason = ParkReason(status)
        elif row is not None and row["status"] == "suspended_drift":
            reason = suspended_reason(row["suspend_reason"])
        else:
            reason = ParkReason.PATCH_FAILED
        remedy = remedy_for(reason, row["suspend_reason"] if row else None)
        if not _accepted(remedy.update, link, h):
            yield violation(
                "parked_without_exit",
                key,
                f"{reason.value}: the remedy names {remedy.update} first, which the guards "
                f"refuse for this link ({remedy.what[:80]}...)",
            )


def finalized_under_missing_slot(ev: Evidence, h: History) -> Iterator[dict[str, object]]:
    """Check 4 at the end of the run (sampler.py checks it during the run)."""
    active = h.active
    if active is None:
        return
    for key, row in sorted(ev.links.items()):
        link = h.links.get(key)
        if row["status"] != "finalized" or link is None:
            continue
        resolved = _active(active, link["action_slot_id"], link["destination_slot_id"])
        problem = resolved and slot_problem(resolved)
        if problem:
            yield violation("finalized_under_missing_slot", key, problem)


def side_checks(ev: Evidence, h: History, parked: Iterable[str]) -> list[dict[str, object]]:
    return [
        *sent_past_fail_closed(h),
        *two_creators(ev, h),
        *parked_without_exit(ev, h, parked),
        *finalized_under_missing_slot(ev, h),
    ]
