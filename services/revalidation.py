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
from enum import StrEnum
from typing import Final

import asyncpg

from db import packs as packs_q
from db import revalidation as q
from db.records import Conn
from protocol.active import resolve_active
from protocol.audit import AuditCommand
from protocol.link_row import LinkRowState
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
    decide_bound,
    judge_new_member,
    result_of,
)
from protocol.revalidation_manifest import (
    RevalidationManifest,
    RevalidationMember,
)
from protocol.snapshots import ActionConfigSnapshot


class Phase(StrEnum):
    LOCKED = "locked"
    WRITTEN = "written"


# Called once per member and phase (for a progress bar); must not do I/O on `conn`.
OnStep = Callable[[Phase, str], None]


def ignore_step(phase: Phase, link_key: str) -> None:
    """The default `OnStep`: no progress shown."""
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
    conn: Conn, manifest: RevalidationManifest, on_step: OnStep = ignore_step
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
    conn: Conn, manifest: RevalidationManifest, on_step: OnStep = ignore_step
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
