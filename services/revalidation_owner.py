"""`revalidate owner` (C-4): one command, after an install change, that validates every
link of an owner key against its active install, in operations of OWNER_CHUNK links."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Generic, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict

from db import audit as audit_q
from db import packs as packs_q
from db import remote_deletions as deletions_q
from db import revalidation as q
from db import revalidation_owner as owner_q
from db import revalidation_scope as scope_q
from db.records import Conn
from protocol.active import resolve_active
from protocol.audit import AuditCommand, AuditEntry
from protocol.drift import INSTALL_REASONS, INSTALL_SURFACE_NAMES
from protocol.link_row import LinkRowState
from protocol.manifest import ManifestInvalid, PackManifest
from protocol.manifest import parse_manifest as parse_pack_manifest
from protocol.remote_deletion import RemoteDeletion, deletion_fact
from protocol.restore_rule import (
    Refusal,
    RestorePath,
    active_slot_pairs,
    deleted_refusal,
    link_of_row,
    refusal,
)
from protocol.revalidation import RevalidationResult, RevalidationStatus
from protocol.revalidation_manifest import Approval, RevalidationMember, build_manifest
from protocol.states import LinkStatus
from services.revalidation import OnStep, apply, ignore_step, validate
from services.revalidation_installs import SlotFingerprints, slot_fingerprints
from services.revalidation_plan import PlanError, planned_member


class OwnerRequest(BaseModel):
    """`revalidate owner`: plan, validate and apply for every link of one owner key,
    under one approval, against the owner's active install."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connector_owner_key: str
    operation_id: str | None = None  # default: derived from the install and the time
    approval: Approval
    # Also move links whose mapping or body fingerprints differ from the install's (a
    # mapping change); without it such an owner is refused before anything is written.
    include_mapping_changes: bool = False


class OwnerOutcome(StrEnum):
    APPLIED = "applied"
    NOTHING_TO_DO = "nothing_to_do"
    REJECTED = "rejected"
    MAPPING_CHANGES = "mapping_changes"


class OwnerResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: OwnerOutcome
    connector_owner_key: str
    pack_install_id: str
    # Links moved from suspended_drift (install change only) back to finalized: how many,
    # and the first few keys.
    restored_count: int = 0
    restored: tuple[str, ...] = ()
    # Links G-4 leaves as they are (their slot is not in the install, or they have another
    # fail-closed finding), each listed once, with why and what to do: how many, the first
    # few. A skipped link is neither restored nor moved.
    skipped_count: int = 0
    skipped: tuple[Refusal, ...] = ()
    mapping_moves: int = 0
    # Links moved onto the install, each with a receipt, by the operations applied (one
    # per OWNER_CHUNK links, so any count fits Postgres's default lock table).
    moved: int = 0
    operations: tuple[str, ...] = ()
    # The rejected operation's conflicts (the operations before it stay applied).
    rejected: RevalidationResult | None = None


class _OwnerPlan(NamedTuple):
    members: list[RevalidationMember]
    skipped: list[Refusal]
    mapping_moves: int


# A page's links mostly share one snapshot: G-4's classification is made once per distinct
# one. Per-link columns are left out of the key (the remote id matters only to a changed
# update path, `protocol.drift._same_route`); the page's rows share one parsed profile
# snapshot per distinct text (db.revalidation.link_states_of), alive while the page is.
_PER_LINK = frozenset(
    {"link_key", "status", "source_record_id", "remote_id", "created_pack_install_id",
     "last_mapping_revalidation_operation_id", "profile_snapshot"}
)  # fmt: skip
_SHARED = tuple(name for name in LinkRowState.model_fields if name not in _PER_LINK)


def _judge(
    pack: PackManifest, install_id: str, rows: Sequence[LinkRowState]
) -> list[Refusal | None]:
    """`protocol.restore_rule.refusal` of each row under the install, in order."""
    cache: dict[tuple[object, ...], Refusal | None] = {}
    judged: list[Refusal | None] = []
    for row in rows:
        action = pack.action_slot(row.action_slot_id)
        route = None if action and action.update_path == row.update_path_template else row.remote_id
        key = (*(getattr(row, name) for name in _SHARED), id(row.profile_snapshot), route)
        if key not in cache:
            active = resolve_active(pack, install_id, row.action_slot_id, row.destination_slot_id)
            cache[key] = refusal(link_of_row(row), active, RestorePath.REVALIDATE_OWNER)
        found = cache[key]
        judged.append(
            found if found is None else found.model_copy(update={"link_key": row.link_key})
        )
    return judged


def _plan_rows(pack: PackManifest, install_id: str, rows: Sequence[LinkRowState]) -> _OwnerPlan:
    slots: SlotFingerprints = {}
    members: list[RevalidationMember] = []
    skipped: list[Refusal] = []
    for row, refused in zip(rows, _judge(pack, install_id, rows), strict=True):
        if refused is not None:
            skipped.append(refused)
            continue
        member = planned_member(slot_fingerprints(slots, pack, install_id, row), install_id, row)
        if member.changes_nothing:
            continue
        members.append(member)
    moves = sum(
        (m.old_mapping_fingerprint, m.old_body_fingerprint)
        != (m.new_mapping_fingerprint, m.new_body_fingerprint)
        for m in members
    )
    return _OwnerPlan(members, skipped, moves)


async def _active_install(conn: Conn, owner: str) -> tuple[str, PackManifest]:
    install = await packs_q.select_active_install(conn, owner)
    if install is None:
        raise PlanError(f"no active pack for owner key {owner!r}")
    try:
        return install.pack_install_id, parse_pack_manifest(install.manifest)
    except ManifestInvalid as error:
        raise PlanError(f"install {install.pack_install_id}: {error}") from error


def owner_operation_id(install_id: str, now: datetime) -> str:
    return f"revalidate-owner-{install_id[:8]}-{now:%Y%m%dT%H%M%S%f}"


# Members per operation of `revalidate owner`. Not for the lock table (an operation takes
# one owner-scope lock whatever its size, NF-7): each operation holds the owner's saves
# only briefly, and a re-run continues after the operations already applied.
OWNER_CHUNK = 2000
EXAMPLES = 5


T = TypeVar("T")


class _Keys(Generic[T]):
    """A count and the first few (bounded memory at any count)."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[T] = []

    def add(self, items: Sequence[T]) -> None:
        self.count += len(items)
        self.examples.extend(items[: max(0, EXAMPLES - len(self.examples))])


async def revalidate_owner(
    conn: Conn, request: OwnerRequest, on_step: OnStep = ignore_step, *, now: datetime
) -> OwnerResult:
    """C-4's way out: every link of the owner validated against its active install.

    1. Read-only, page by page: what moving the waiting links (finalized under another
       install, or suspended for an install change and nothing else) would move; a
       mapping move is refused unless asked for (nothing written).
    2. The install-only suspensions back to `finalized`, a page per transaction, link
       locks in link-key order, one audit entry each (their old install still fails
       closed until 3). G-4 (`protocol.restore_rule`) first: a link whose slot the
       install lacks, or with another fail-closed finding, is neither restored (1-2) nor
       moved (3); it is listed once, skipped, with its remedy.
    3. For each page of `OWNER_CHUNK` finalized links that move: the §9 manifest under the
       one approval, validated, then applied in one transaction with its receipts. A
       rejected page stops the run: the pages before it stay applied (and a re-run
       continues), its links and the rest still fail closed.
    """
    owner, approval = request.connector_owner_key, request.approval
    install_id, pack = await _active_install(conn, owner)
    suspended = await owner_q.install_suspended_link_states(
        conn, owner, list(INSTALL_REASONS), list(INSTALL_SURFACE_NAMES)
    )
    waiting = _plan_rows(pack, install_id, suspended)
    moves = waiting.mapping_moves
    async for page in _finalized_pages(conn, owner):
        moves += _plan_rows(pack, install_id, page).mapping_moves
    base = OwnerResult(
        outcome=OwnerOutcome.NOTHING_TO_DO,
        connector_owner_key=owner,
        pack_install_id=install_id,
        mapping_moves=moves,
    )
    if moves and not request.include_mapping_changes:
        return base.model_copy(update={"outcome": OwnerOutcome.MAPPING_CHANGES})
    # G-4: a suspended link the rule refuses stays suspended, listed once (here), and so
    # never reaches the finalized pages below.
    skipped: _Keys[Refusal] = _Keys()
    skipped.add(waiting.skipped)
    refused = {r.link_key for r in waiting.skipped}
    keys = [row.link_key for row in suspended if row.link_key not in refused]
    del suspended, waiting, refused
    keys = await _without_deleted_objects(conn, keys, skipped)
    restored: _Keys[str] = _Keys()
    for start in range(0, len(keys), OWNER_CHUNK):
        chunk = keys[start : start + OWNER_CHUNK]
        restored.add(await _restore(conn, (owner, install_id, pack), chunk, approval))
    del keys
    moved = 0
    operations: list[str] = []
    base_id = request.operation_id or owner_operation_id(install_id, now)
    rejected: RevalidationResult | None = None
    async for page in _finalized_pages(conn, owner):
        plan = _plan_rows(pack, install_id, page)
        skipped.add(plan.skipped)
        if not plan.members:
            continue
        operation_id = await _next_operation_id(conn, base_id, len(operations) + 1)
        manifest = build_manifest(operation_id, approval, plan.members)
        result = await validate(conn, manifest, on_step)
        if result.status is RevalidationStatus.VALIDATED:
            result = await apply(conn, manifest, on_step)
        if result.status is not RevalidationStatus.APPLIED:
            rejected = result
            break
        operations.append(operation_id)
        moved += result.receipt_count
    outcome = (
        OwnerOutcome.REJECTED
        if rejected is not None
        else OwnerOutcome.APPLIED
        if moved or restored.count
        else OwnerOutcome.NOTHING_TO_DO
    )
    return base.model_copy(
        update={
            "outcome": outcome,
            "restored_count": restored.count,
            "restored": tuple(restored.examples),
            "skipped_count": skipped.count,
            "skipped": tuple(skipped.examples),
            "moved": moved,
            "operations": tuple(operations),
            "rejected": rejected,
        }
    )


async def _without_deleted_objects(
    conn: Conn, keys: list[str], skipped: _Keys[Refusal]
) -> list[str]:
    """G-8: a suspended link whose remote object the remote reported deleted stays
    suspended, listed once as skipped naming the event; the other keys, in order."""
    deleted: dict[str, list[RemoteDeletion]] = {}
    for start in range(0, len(keys), OWNER_CHUNK):
        deleted.update(await deletions_q.of_links(conn, keys[start : start + OWNER_CHUNK]))
    skipped.add(
        [
            deleted_refusal(key, RestorePath.REVALIDATE_OWNER, deletion_fact(found[0]))
            for key, found in deleted.items()
        ]
    )
    return [key for key in keys if key not in deleted]


async def _finalized_pages(conn: Conn, owner: str) -> AsyncIterator[list[LinkRowState]]:
    after = ""
    while page := await owner_q.finalized_link_states_page(conn, owner, after, OWNER_CHUNK):
        yield page
        after = page[-1].link_key


async def _next_operation_id(conn: Conn, base: str, start: int) -> str:
    """`base.N` for the first N from `start` that no earlier run has used (a re-run of the
    same --operation-id continues after the operations it applied)."""
    n = start
    while await q.operation_exists(conn, f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


async def _restore(
    conn: Conn, against: tuple[str, str, PackManifest], keys: list[str], approval: Approval
) -> list[str]:
    """Lift the install-change suspension of `keys` (judged restorable under the install
    `against` names: owner, install id, manifest), in one transaction. The owner's pack lock
    first (as `pack apply` and backfill take it), so no apply lands between the check and
    the update, and the update itself restores only links whose two slots the install
    still has (G-4, under any race)."""
    if not keys:
        return []
    owner, install_id, pack = against
    who = (approval.approved_by, approval.reason)
    async with conn.transaction():
        await packs_q.lock_owner_key(conn, owner)
        current = await packs_q.select_active_install(conn, owner)
        if current is None or current.pack_install_id != install_id:
            raise PlanError(f"the active install of {owner!r} changed during the run; re-run")
        await scope_q.lock_link_keys(conn, keys)
        guard = owner_q.RestoreGuard(install_id, *active_slot_pairs(pack))
        moved = await owner_q.restore_install_suspended(
            conn, keys, list(INSTALL_REASONS), who, guard
        )
        entries = [
            AuditEntry(
                operator=approval.approved_by,
                reason=approval.reason,
                command=AuditCommand.REVALIDATE_OWNER,
                link_key=restored.link_key,
                arguments={
                    "connector_owner_key": owner,
                    "approval_reference": approval.approval_reference,
                },
                state_before={
                    "status": LinkStatus.SUSPENDED_DRIFT.value,
                    "suspend_reason": restored.suspend_reason,
                },
                state_after={"status": LinkStatus.FINALIZED.value},
                outcome="install-change suspension lifted; receipts follow",
            )
            for restored in moved
        ]
        if entries:
            await audit_q.append_many(conn, entries)
    return [restored.link_key for restored in moved]
