"""Bulk finalized-link mapping revalidation (SPEC §9 REV-1..3): validate, apply, plan.

`validate` and `apply` take the same locks and run the same checks
(`protocol.revalidation.decide`); `validate` always rolls back, `apply` writes
every receipt and every link move in one transaction or nothing. Neither
touches attempts, local records or the remote (REV-3): this module imports no
such query or client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from enum import StrEnum
from typing import Final, NamedTuple

import asyncpg
from pydantic import BaseModel, ConfigDict, ValidationError

from db import audit as audit_q
from db import packs as packs_q
from db import revalidation as q
from db.records import Conn
from protocol.active import resolve_active
from protocol.audit import AuditCommand, AuditEntry
from protocol.drift import INSTALL_REASONS, INSTALL_SURFACE_NAMES
from protocol.link_row import LinkRowState, plan_member
from protocol.manifest import ManifestInvalid, PackManifest
from protocol.manifest import parse_manifest as parse_pack_manifest
from protocol.revalidation import (
    Apply,
    Conflict,
    ConflictReason,
    Decision,
    InstallFingerprints,
    Judgement,
    LockedMember,
    Rejected,
    RevalidationResult,
    RevalidationStatus,
    decide_bound,
    judge_new_member,
    result_of,
)
from protocol.revalidation_manifest import (
    Approval,
    RevalidationManifest,
    RevalidationMember,
    build_manifest,
)
from protocol.snapshots import ActionConfigSnapshot
from protocol.states import LinkStatus


class Phase(StrEnum):
    LOCKED = "locked"
    WRITTEN = "written"


# Called once per member and phase (for a progress bar); must not do I/O on `conn`.
OnStep = Callable[[Phase, str], None]


def _ignore(phase: Phase, link_key: str) -> None:
    del phase, link_key


# validate and apply hold two advisory locks per member (its link key's and its occupancy
# key's) until the transaction ends; Postgres keeps them in one lock table for the whole
# server, about max_locks_per_transaction x max_connections slots (64 x 100 by default).
# Measured on the embedded server (200 connections): 20,000 such locks fit, 50,000 do not.
LOCKS_PER_MEMBER: Final = 2


def lock_table_setting(members: int, max_connections: int) -> int:
    """The max_locks_per_transaction whose lock table holds a `members`-member manifest's
    locks twice over (the rest of the server needs slots too), never below the default."""
    return max(64, -(-2 * LOCKS_PER_MEMBER * members // max_connections))


class LockTableTooSmall(Exception):
    """Postgres's lock table ran out while the manifest's locks were being taken; the
    transaction rolled back, so nothing was written. Phrased for the operator."""

    def __init__(self, members: int, per_transaction: int, connections: int) -> None:
        self.needed = lock_table_setting(members, connections)
        super().__init__(
            f"Postgres's lock table cannot hold this manifest's locks: its {members:,} members "
            f"take {LOCKS_PER_MEMBER * members:,} advisory locks until commit, and "
            f"max_locks_per_transaction = {per_transaction} x max_connections = {connections} "
            f"holds about {per_transaction * connections:,} for the whole server; nothing was "
            f"written. Set max_locks_per_transaction to at least {self.needed} and restart "
            "Postgres, or plan the move as several smaller operations (--link-key ...)"
        )


@asynccontextmanager
async def _lock_table_checked(conn: Conn, members: int) -> AsyncIterator[None]:
    """Around a revalidation's transaction: lock-table exhaustion, once it has rolled back,
    becomes `LockTableTooSmall` with the server's settings."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        if not q.lock_table_exhausted(exc):
            raise
        per_transaction, connections = await q.lock_table_settings(conn)
        raise LockTableTooSmall(members, per_transaction, connections) from exc


class _CasLost(Exception):
    """A member's row moved under its lock: roll the whole manifest back (invariant 4)."""

    def __init__(self, conflict: Conflict) -> None:
        super().__init__(conflict.detail)
        self.conflict = conflict


async def validate(
    conn: Conn, manifest: RevalidationManifest, on_step: OnStep = _ignore
) -> RevalidationResult:
    """Dry run (invariant 6): same locks and checks, projected receipts, zero writes.
    Raises `LockTableTooSmall` when the server cannot hold the manifest's locks."""
    # Not READ ONLY: Postgres refuses FOR UPDATE there, and the row locks are the point.
    async with _lock_table_checked(conn, len(manifest.members)):
        tx = conn.transaction()
        await tx.start()
        try:
            decision, _ = await _lock_and_decide(conn, manifest, on_step)
        finally:
            await tx.rollback()
    return result_of(manifest, decision, applied=False)


async def apply(
    conn: Conn, manifest: RevalidationManifest, on_step: OnStep = _ignore
) -> RevalidationResult:
    """The only mutation entry point: all receipts and link moves commit together, or none.
    Raises `LockTableTooSmall` (after the rollback) when the server cannot hold its locks."""
    decision: Decision
    try:
        async with _lock_table_checked(conn, len(manifest.members)), conn.transaction():
            decision, versions = await _lock_and_decide(conn, manifest, on_step)
            if isinstance(decision, Apply):
                await _write(conn, manifest, decision, versions, on_step)
    except _CasLost as lost:
        decision = Rejected(conflicts=(lost.conflict,))
    return result_of(manifest, decision, applied=True)


# Members per statement: validate and apply run a handful of statements per page,
# not per member (issue 16, P4). Large, because a statement that takes a page's advisory
# locks costs Postgres, when it ends, a walk over every lock the transaction holds (a
# statement's resource owner tracks only a few locks by name; past that, they are
# reassigned by scanning the backend's whole lock table): n members in pages of k cost
# ~n^2/k lock visits. Measured at n=100,000: 1.9 s of the statements after the locks at
# k=1,000, 0.6 s at k=5,000.
PAGE = 5000


async def _lock_and_decide(
    conn: Conn, manifest: RevalidationManifest, on_step: OnStep
) -> tuple[Decision, dict[str, int]]:
    """The decision, and the row_version each existing member's row was read at."""
    # Members are sorted by link key (invariant 1), and each page locks its links, then
    # their rows, then their occupancy keys, each set in link-key order: every row or
    # occupancy lock of a link is taken after its link lock, which every transaction
    # takes in link-key order, so two revalidations (or one and a save) cannot deadlock.
    members = manifest.members
    # (A manifest without members never parses; an empty page keeps this total anyway.)
    pages = [members[start : start + PAGE] for start in range(0, len(members), PAGE)] or [()]
    locked: list[LockedMember] = []
    judged: list[Judgement] = []
    versions: dict[str, int] = {}

    def read(page: Sequence[RevalidationMember]) -> asyncio.Future[list[LockedMember]]:
        return asyncio.ensure_future(_lock_page(conn, [m.link_key for m in page], versions))

    # Postgres takes the next page's locks while this one is judged: the judging (row
    # digests, projected receipts) is most of a page's cost, and the server would
    # otherwise wait for it on the second core (issue 16, P4). Still one statement at a
    # time on the connection, in the order above.
    reading = read(pages[0])
    try:
        for index, page in enumerate(pages):
            rows = await reading
            if index + 1 < len(pages):
                reading = read(pages[index + 1])
            locked.extend(rows)
            for row in rows:
                on_step(Phase.LOCKED, row.link_key)
            judged.extend(await _judge(manifest, page, rows))
    finally:
        await _settled(reading)
    # Read after the locks: a concurrent apply of this operation has committed by now.
    receipts = await q.operation_receipts(conn, manifest.operation_id)
    produced = await _produced_fingerprints(conn, members, locked)
    return decide_bound(manifest, locked, receipts, produced, judged), versions


# Members judged between two chances for the page being read to send its next statement.
_JUDGED_PER_YIELD = 100


async def _judge(
    manifest: RevalidationManifest,
    members: Sequence[RevalidationMember],
    page: Sequence[LockedMember],
) -> list[Judgement]:
    judged: list[Judgement] = []
    for n, (member, lock) in enumerate(zip(members, page, strict=True)):
        if n % _JUDGED_PER_YIELD == 0:
            await asyncio.sleep(0)  # let the next page's reading move on
        judged.append(judge_new_member(manifest, member, lock))
    return judged


async def _settled(task: asyncio.Future[list[LockedMember]]) -> None:
    """Wait for a page read that may still be running, so no statement is left on the
    connection when its transaction ends; when the caller is failing, its own error is
    the one raised, so the read's outcome is dropped (and marked retrieved)."""
    if not task.done():
        await asyncio.wait([task])
    if not task.cancelled():
        task.exception()


async def _produced_fingerprints(
    conn: Conn, members: Sequence[RevalidationMember], locked: Sequence[LockedMember]
) -> dict[str, InstallFingerprints | None]:
    """Each member's new fingerprints recomputed from its `new_pack_install_id` (item 6)."""
    packs: dict[str, PackManifest | None] = {}
    slots: SlotFingerprints = {}
    produced: dict[str, InstallFingerprints | None] = {}
    for member, lock in zip(members, locked, strict=True):
        install = member.new_pack_install_id
        if install not in packs:
            packs[install] = await _install_manifest(conn, install)
        pack = packs[install]
        if lock.row is not None and pack is not None:
            produced[member.link_key] = slot_fingerprints(slots, pack, install, lock.row)
    return produced


async def _install_manifest(conn: Conn, pack_install_id: str) -> PackManifest | None:
    install = await packs_q.select_install(conn, pack_install_id)
    if install is None:
        return None
    try:
        return parse_pack_manifest(install.manifest)
    except ManifestInvalid:
        return None


# What an install produces depends on the install and the row's two slot ids only; a bulk
# manifest has thousands of members per slot, so it is resolved once per slot (issue 16 P4).
SlotFingerprints = dict[tuple[str, str, str], InstallFingerprints | None]


def slot_fingerprints(
    cache: SlotFingerprints, pack: PackManifest, install_id: str, row: LinkRowState
) -> InstallFingerprints | None:
    """`install_fingerprints`, remembered in `cache` by (install, action, destination slot)."""
    slot = (install_id, row.action_slot_id, row.destination_slot_id)
    if slot not in cache:
        cache[slot] = install_fingerprints(pack, install_id, row)
    return cache[slot]


def install_fingerprints(
    pack: PackManifest, install_id: str, row: LinkRowState
) -> InstallFingerprints | None:
    """What `install_id` (its manifest `pack`) produces for `row`'s action slot, or None."""
    active = resolve_active(pack, install_id, row.action_slot_id, row.destination_slot_id)
    if active.action is None:
        return None
    config = ActionConfigSnapshot.of(active.action)
    return InstallFingerprints(
        mapping_fingerprint=config.mapping_fingerprint, body_fingerprint=config.body_fingerprint
    )


async def _lock_page(conn: Conn, keys: list[str], versions: dict[str, int]) -> list[LockedMember]:
    """Lock and read one page of members, adding their rows' versions to `versions`."""
    await q.lock_link_keys(conn, keys)
    read = await q.link_states_for_update(conn, keys)
    await q.lock_occupancy_keys(conn, keys)
    occupying = await q.occupying_attempts(conn, keys)
    rows = {key: locked.state for key, locked in read.items()}
    versions.update((key, locked.version) for key, locked in read.items())
    pointers = {
        key: row.last_mapping_revalidation_operation_id
        for key, row in rows.items()
        if row.last_mapping_revalidation_operation_id is not None
    }
    prior = await q.pointer_receipts(conn, pointers) if pointers else {}
    return [
        LockedMember(
            link_key=key,
            row=rows.get(key),
            occupying_attempt_ids=occupying.get(key, ()),
            pointer_receipt=prior.get(key),
        )
        for key in keys
    ]


async def _write(
    conn: Conn,
    manifest: RevalidationManifest,
    decision: Apply,
    versions: dict[str, int],
    on_step: OnStep,
) -> None:
    members, receipts, approval = manifest.members, decision.receipts, manifest.approval
    who = (approval.approved_by, approval.reason)
    for start in range(0, len(members), PAGE):
        page = list(members[start : start + PAGE])
        # The receipts first: the links' new pointers reference them.
        await q.insert_receipts(conn, list(receipts[start : start + PAGE]))
        # decide applies only when every member's row exists, so each has its version.
        read_at = [versions[member.link_key] for member in page]
        moved = await q.move_links_mapping(conn, page, read_at, manifest.operation_id, who)
        for member in page:
            _check_moved(member.link_key, moved.get(member.link_key))
            on_step(Phase.WRITTEN, member.link_key)
    # OPS-2: the approver is who acted; each entry's before/after is its receipt's.
    await q.audit_operation(
        conn,
        manifest.operation_id,
        AuditCommand.REVALIDATE_APPLY,
        (*who, approval.approval_reference),
    )


def _check_moved(link_key: str, as_planned: bool | None) -> None:
    """The moved row is the after-state its receipt's digest was computed from: the tuple
    read under the lock (same row_version), with only the planned values moved."""
    if not as_planned:
        detail = (
            "compare-and-set matched no row" if as_planned is None else "row changed under its lock"
        )
        raise _CasLost(Conflict(link_key=link_key, reason=ConflictReason.CAS_LOST, detail=detail))


# -- planning (read-only: release engineers' plan -> validate -> apply) ------------------


class PlanError(ValueError):
    """The manifest cannot be planned as asked; nothing was read under lock or written."""


class PlanRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: str
    approval: Approval
    new_pack_install_id: str
    # None: every finalized link of the install's owner key that would move.
    link_keys: tuple[str, ...] | None = None


async def plan(conn: Conn, request: PlanRequest) -> RevalidationManifest:
    """A canonical manifest moving the links to the install's current fingerprints."""
    install = await packs_q.select_install(conn, request.new_pack_install_id)
    if install is None:
        raise PlanError(f"no pack install {request.new_pack_install_id}")
    try:
        pack = parse_pack_manifest(install.manifest)
    except ManifestInvalid as error:
        raise PlanError(f"install {install.pack_install_id}: {error}") from error
    rows = await _planned_rows(conn, request, pack.connector_owner_key)
    install_id = install.pack_install_id
    slots: SlotFingerprints = {}
    members = [_member(slot_fingerprints(slots, pack, install_id, row), install_id, row)
               for row in rows]  # fmt: skip
    moving = [m for m in members if not m.changes_nothing]
    if request.link_keys is not None and len(moving) != len(members):
        idle = sorted({m.link_key for m in members} - {m.link_key for m in moving})
        raise PlanError(f"already at the install's fingerprints: {', '.join(idle)}")
    if not moving:
        raise PlanError("no finalized link would move")
    return build_manifest(request.operation_id, request.approval, moving)


async def _planned_rows(conn: Conn, request: PlanRequest, owner: str) -> list[LinkRowState]:
    if request.link_keys is None:
        return await q.finalized_link_states(conn, owner)
    rows = await q.link_states(conn, list(request.link_keys))
    missing = sorted(set(request.link_keys) - {row.link_key for row in rows})
    if missing:
        raise PlanError(f"no link {', '.join(missing)}")
    for row in rows:
        if row.status != LinkStatus.FINALIZED or row.connector_owner_key != owner:
            raise PlanError(f"{row.link_key}: {row.status} link of owner {row.connector_owner_key}")
    return rows


def _member(
    produced: InstallFingerprints | None, install_id: str, row: LinkRowState
) -> RevalidationMember:
    if produced is None:
        raise PlanError(f"{row.link_key}: action slot {row.action_slot_id!r} is not in the pack")
    try:
        return plan_member(row, produced.mapping_fingerprint, produced.body_fingerprint, install_id)
    except ValidationError as error:
        raise PlanError(f"{row.link_key}: not plannable ({error.errors()[0]['msg']})") from None


# -- one command for an owner after an install change (C-4) ------------------------------


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
    # Finalized links whose action slot the install does not have: not revalidated here.
    skipped_count: int = 0
    skipped: tuple[str, ...] = ()
    mapping_moves: int = 0
    # Links moved onto the install, each with a receipt, by the operations applied (one
    # per OWNER_CHUNK links, so any count fits Postgres's default lock table).
    moved: int = 0
    operations: tuple[str, ...] = ()
    # The rejected operation's conflicts (the operations before it stay applied).
    rejected: RevalidationResult | None = None


class _OwnerPlan(NamedTuple):
    members: list[RevalidationMember]
    skipped: list[str]
    mapping_moves: int


def _plan_rows(pack: PackManifest, install_id: str, rows: Sequence[LinkRowState]) -> _OwnerPlan:
    slots: SlotFingerprints = {}
    members: list[RevalidationMember] = []
    skipped: list[str] = []
    for row in rows:
        produced = slot_fingerprints(slots, pack, install_id, row)
        if produced is None:
            skipped.append(row.link_key)
            continue
        member = _member(produced, install_id, row)
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


# Members per operation of `revalidate owner`: two advisory locks each until commit, well
# inside Postgres's default lock table (64 x 100 slots, see `LockTableTooSmall`).
OWNER_CHUNK = 2000
EXAMPLES = 5


class _Keys:
    """A count and the first few keys (bounded memory at any count)."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[str] = []

    def add(self, keys: Sequence[str]) -> None:
        self.count += len(keys)
        self.examples.extend(keys[: max(0, EXAMPLES - len(self.examples))])


async def revalidate_owner(
    conn: Conn, request: OwnerRequest, on_step: OnStep = _ignore, *, now: datetime
) -> OwnerResult:
    """C-4's way out: every link of the owner validated against its active install.

    1. Read-only, page by page: what moving the waiting links (finalized under another
       install, or suspended for an install change and nothing else) would move; a
       mapping move is refused unless asked for (nothing written).
    2. The install-only suspensions back to `finalized`, a page per transaction, link
       locks in link-key order, one audit entry each (their old install still fails
       closed until 3).
    3. For each page of `OWNER_CHUNK` finalized links that move: the §9 manifest under the
       one approval, validated, then applied in one transaction with its receipts. A
       rejected page stops the run: the pages before it stay applied (and a re-run
       continues), its links and the rest still fail closed.
    """
    owner, approval = request.connector_owner_key, request.approval
    install_id, pack = await _active_install(conn, owner)
    suspended = await q.install_suspended_link_states(
        conn, owner, list(INSTALL_REASONS), list(INSTALL_SURFACE_NAMES)
    )
    moves = _plan_rows(pack, install_id, suspended).mapping_moves
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
    restored = _Keys()
    keys = [row.link_key for row in suspended]
    for start in range(0, len(keys), OWNER_CHUNK):
        restored.add(await _restore(conn, owner, keys[start : start + OWNER_CHUNK], approval))
    del suspended, keys
    skipped, moved = _Keys(), 0
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
        moved += len(result.receipts)
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


async def _finalized_pages(conn: Conn, owner: str) -> AsyncIterator[list[LinkRowState]]:
    after = ""
    while page := await q.finalized_link_states_page(conn, owner, after, OWNER_CHUNK):
        yield page
        after = page[-1].link_key


async def _next_operation_id(conn: Conn, base: str, start: int) -> str:
    """`base.N` for the first N from `start` that no earlier run has used (a re-run of the
    same --operation-id continues after the operations it applied)."""
    n = start
    while await q.operation_exists(conn, f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


async def _restore(conn: Conn, owner: str, keys: list[str], approval: Approval) -> list[str]:
    if not keys:
        return []
    who = (approval.approved_by, approval.reason)
    async with conn.transaction():
        await q.lock_link_keys(conn, keys)
        moved = await q.restore_install_suspended(conn, keys, list(INSTALL_REASONS), who)
        entries = [
            AuditEntry(
                operator=approval.approved_by,
                reason=approval.reason,
                command=AuditCommand.REVALIDATE_OWNER,
                link_key=key,
                arguments={
                    "connector_owner_key": owner,
                    "approval_reference": approval.approval_reference,
                },
                state_before={"status": LinkStatus.SUSPENDED_DRIFT.value, "suspend_reason": why},
                state_after={"status": LinkStatus.FINALIZED.value},
                outcome="install-change suspension lifted; receipts follow",
            )
            for key, why in moved
        ]
        if entries:
            await audit_q.append_many(conn, entries)
    return [key for key, _ in moved]
