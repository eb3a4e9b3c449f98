"""Bulk finalized-link mapping revalidation (SPEC §9 REV-1..3): validate, apply.

`validate` and `apply` take the same locks and run the same checks
(`protocol.revalidation`); `validate` always rolls back, `apply` writes every receipt
and every link move in one transaction or nothing. Both stream (NF-7): the manifest
is read a page at a time (services.revalidation_source), each page locked, judged and
written set-wise, and only a page (plus the first SHOWN receipts or conflicts, for the
report) is in memory. The lock that keeps every other writer of the owner's links out
is one advisory lock per owner key, taken exclusively first (db/revalidation.py
LOCK_OWNER_SCOPES), whatever the member count: Postgres's default lock table holds
it for a million members. Neither entry point touches attempts, local records or the
remote (REV-3): this module imports no such query or client.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import StrEnum

from db import revalidation as q
from db import revalidation_scope as scope_q
from db.records import Conn
from protocol.audit import AuditCommand
from protocol.manifest import PackManifest
from protocol.revalidation import (
    SHOWN,
    Conflict,
    ConflictReason,
    InstallFingerprints,
    RevalidationReceipt,
    RevalidationResult,
    RevalidationStatus,
    binding_conflicts,
    judge_new_member,
    retry_conflicts,
)
from protocol.revalidation_manifest import (
    RevalidationManifest,
    RevalidationMember,
)
from services.revalidation_installs import (
    SlotFingerprints,
    install_fingerprints,
    install_manifest,
    slot_fingerprints,
)
from services.revalidation_pages import (
    PER_YIELD,
    CasLost,
    Locked,
    PageWrite,
    ReadPage,
    locked_page,
    read_page,
    write_page,
)
from services.revalidation_source import ManifestSource, as_source

__all__ = [
    "PAGE",
    "OnStep",
    "Phase",
    "apply",
    "ignore_step",
    "install_fingerprints",
    "slot_fingerprints",
    "validate",
]


class Phase(StrEnum):
    LOCKED = "locked"
    WRITTEN = "written"


# Called once per member and phase (for a progress bar); must not do I/O on `conn`.
OnStep = Callable[[Phase, str], None]


def ignore_step(phase: Phase, link_key: str) -> None:
    """The default `OnStep`: no progress shown."""
    del phase, link_key


class _RolledBack(Exception):
    """Leave apply's transaction without committing; `result` is what to report."""

    def __init__(self, result: RevalidationResult) -> None:
        super().__init__(result.status.value)
        self.result = result


async def validate(
    conn: Conn, manifest: RevalidationManifest | ManifestSource, on_step: OnStep = ignore_step
) -> RevalidationResult:
    """Dry run (invariant 6): same locks and checks, projected receipts, zero writes."""
    # Not READ ONLY: Postgres refuses FOR UPDATE there, and the row locks are the point.
    tx = conn.transaction()
    await tx.start()
    try:
        return await _Run(conn, as_source(manifest), on_step, write=False).run()
    finally:
        await tx.rollback()


async def apply(
    conn: Conn, manifest: RevalidationManifest | ManifestSource, on_step: OnStep = ignore_step
) -> RevalidationResult:
    """The only mutation entry point: all receipts and link moves commit together, or none
    (a conflict found on any page rolls back the pages written before it)."""
    try:
        async with conn.transaction():
            result = await _Run(conn, as_source(manifest), on_step, write=True).run()
            if result.status is not RevalidationStatus.APPLIED:
                raise _RolledBack(result)
    except _RolledBack as back:
        return back.result
    except CasLost as lost:
        head = as_source(manifest).head
        return RevalidationResult(
            status=RevalidationStatus.REJECTED,
            operation_id=head.operation_id,
            manifest_digest=head.manifest_digest,
            conflicts=(lost.conflict,),
            conflict_count=1,
        )
    return result


# Members per page: each page is read, judged and written in a handful of set-wise
# statements (unnest of the page's keys, COPY of its receipts, UPDATE ... FROM unnest), and
# only the page is in memory. The locks do not grow with the page or the manifest: one
# advisory lock per owner key, and row locks (kept in the rows, not in Postgres's lock
# table).
PAGE = 5000


class _Run:
    """One validate or apply: owner scope locked, then page by page (NF-7)."""

    def __init__(self, conn: Conn, source: ManifestSource, on_step: OnStep, *, write: bool):
        self.conn, self.source, self.on_step, self.write = conn, source, on_step, write
        self.head = source.head
        self.receipts: list[RevalidationReceipt] = []
        self.conflicts: list[Conflict] = []
        self.receipt_count = 0
        self.conflict_count = 0
        self.installs: dict[str, PackManifest | None] = {}
        self.slots: SlotFingerprints = {}

    async def run(self) -> RevalidationResult:
        head = self.head
        owners = await self._scope()
        await scope_q.lock_owner_scopes(self.conn, owners)
        # Read under the scope lock: a concurrent apply of this operation has committed.
        self.owners = frozenset(owners)
        retry = await q.operation_exists(self.conn, head.operation_id)
        # Parsed a part of a page at a time, the event loop let in between (`_next_page`).
        pages = self.source.pages(math.gcd(PAGE, PER_YIELD))
        current = await _next_page(pages)
        self.upcoming: Sequence[RevalidationMember] | None = None
        self.reading = self._read(current or ())
        self.unwritten: PageWrite | None = None
        try:
            # One page parsed ahead: the next page's read is started the moment the page
            # before it is in, and this process parses the page after it meanwhile.
            if current is not None:
                self.upcoming = await _next_page(pages)
            while current is not None:
                read = await self.reading
                # This page's own statements first (one statement at a time on `conn`),
                # then Postgres writes the page judged before and reads the next while
                # this process makes this page's models and judges them (bench P4:
                # Postgres is the slower side, so it is never left waiting).
                if retry:
                    stored = await self._stored(current)
                    upcoming = await self._read_next(pages)
                    self._verify_page(current, await locked_page(read), stored)
                else:
                    await self._load_installs(current)
                    upcoming = await self._read_next(pages)
                    locked = await locked_page(read)
                    await self._judge_and_write(current, locked, self._produced(current, locked))
                current = upcoming
            await self.reading  # the last write (or read): its error, if any, is raised
        finally:
            await _settled(self.reading)
        if self.unwritten is not None:  # the last page's write
            await self._write(self.unwritten)
        if retry:
            await self._verify_end()
            status = RevalidationStatus.ALREADY_APPLIED
        else:
            status = RevalidationStatus.APPLIED if self.write else RevalidationStatus.VALIDATED
            if self.write and not self.conflict_count:
                await self._audit()
        if self.conflict_count:
            status = RevalidationStatus.REJECTED
        return RevalidationResult(
            status=status,
            operation_id=head.operation_id,
            manifest_digest=head.manifest_digest,
            receipts=() if self.conflict_count else tuple(self.receipts),
            conflicts=tuple(self.conflicts),
            receipt_count=0 if self.conflict_count else self.receipt_count,
            conflict_count=self.conflict_count,
        )

    async def _scope(self) -> list[str]:
        """The owner keys to lock: the header's, or (a manifest in memory) its links'."""
        if self.head.connector_owner_key is not None:
            return [self.head.connector_owner_key]
        keys = [m.link_key for page in self.source.pages(PAGE) for m in page]
        return await q.owners_of(self.conn, keys)

    def _read(self, page: Sequence[RevalidationMember]) -> asyncio.Future[ReadPage]:
        return asyncio.ensure_future(read_page(self.conn, [m.link_key for m in page]))

    async def _read_next(
        self, pages: Iterator[Sequence[RevalidationMember]]
    ) -> Sequence[RevalidationMember] | None:
        """The next page (None: the manifest has no more), its reading started, after
        the write of the page judged before, if any; then the page after it is parsed
        while Postgres writes one page and reads the next."""
        upcoming = self.upcoming
        unwritten, self.unwritten = self.unwritten, None
        if upcoming is not None or unwritten is not None:
            self.reading = asyncio.ensure_future(self._write_then_read(unwritten, upcoming or ()))
        if upcoming is not None:
            self.upcoming = await _next_page(pages)
        return upcoming

    async def _write_then_read(
        self, unwritten: PageWrite | None, page: Sequence[RevalidationMember]
    ) -> ReadPage:
        if unwritten is not None:
            await self._write(unwritten)
        return await read_page(self.conn, [m.link_key for m in page])

    async def _write(self, unwritten: PageWrite) -> None:
        page, receipts, versions = unwritten
        await write_page(self.conn, self.head, page, receipts, versions)
        for member in page:
            self.on_step(Phase.WRITTEN, member.link_key)

    def _conflict(self, conflicts: Iterable[Conflict]) -> None:
        for conflict in conflicts:
            self.conflict_count += 1
            if len(self.conflicts) < SHOWN:
                self.conflicts.append(conflict)

    def _receipt(self, receipt: RevalidationReceipt) -> None:
        self.receipt_count += 1
        if len(self.receipts) < SHOWN:
            self.receipts.append(receipt)

    async def _judge_and_write(
        self,
        page: Sequence[RevalidationMember],
        locked: Locked,
        produced: Mapping[str, InstallFingerprints | None],
    ) -> None:
        """Invariants 2-3 and item 6 for a new operation's page; apply writes the page
        while no member anywhere conflicts (after which the rest is only judged)."""
        written: list[RevalidationReceipt] = []
        unprojected = 0
        for n, (member, lock) in enumerate(zip(page, locked.members, strict=True)):
            if n % PER_YIELD == 0:
                await asyncio.sleep(0)  # let the next page's reading move on
            self.on_step(Phase.LOCKED, member.link_key)
            if lock.row is not None and lock.row.connector_owner_key not in self.owners:
                self._conflict([_other_owner(member, lock.row.connector_owner_key)])
                continue
            bound = list(binding_conflicts(member, lock, produced.get(member.link_key)))
            if bound:
                self._conflict(bound)
                continue
            # A dry run makes only the receipts it reports (SHOWN); apply, every one.
            project = self.write or self.receipt_count + len(written) < SHOWN
            judged = judge_new_member(self.head, member, lock, project=project)
            self._conflict(judged.conflicts)
            if judged.receipt is not None:
                written.append(judged.receipt)
            elif not judged.conflicts:
                unprojected += 1
        if self.conflict_count:
            return
        for receipt in written:
            self._receipt(receipt)
        self.receipt_count += unprojected
        if self.write:  # written once the next page is read (`_read_next`)
            self.unwritten = PageWrite(page, written, locked.versions)

    async def _stored(self, page: Sequence[RevalidationMember]) -> dict[str, RevalidationReceipt]:
        """A retry's page: the receipts the operation wrote for it (its keys staged)."""
        keys = [m.link_key for m in page]
        stored = await q.page_receipts(self.conn, self.head.operation_id, keys)
        await q.stage_member_keys(self.conn, keys)
        return stored

    def _verify_page(
        self,
        page: Sequence[RevalidationMember],
        locked: Locked,
        stored: Mapping[str, RevalidationReceipt],
    ) -> None:
        """Invariant 5, a page at a time: every member's receipt and link as applied."""
        for member, lock in zip(page, locked.members, strict=True):
            self.on_step(Phase.LOCKED, member.link_key)
            receipt = stored.get(member.link_key)
            found = list(retry_conflicts(self.head, member, lock, receipt))
            self._conflict(found)
            if not found and receipt is not None:
                self._receipt(receipt)

    async def _verify_end(self) -> None:
        others = await q.receipts_not_staged(self.conn, self.head.operation_id, SHOWN)
        detail = "receipt under this operation, not a member"
        self._conflict(
            Conflict(link_key=key, reason=ConflictReason.MIXED_STATE, detail=detail)
            for key in others
        )

    async def _load_installs(self, page: Sequence[RevalidationMember]) -> None:
        """The installs the page's members name, each read once per run."""
        for install in {member.new_pack_install_id for member in page} - self.installs.keys():
            self.installs[install] = await install_manifest(self.conn, install)

    def _produced(
        self, page: Sequence[RevalidationMember], locked: Locked
    ) -> dict[str, InstallFingerprints | None]:
        """Each member's new fingerprints recomputed from its `new_pack_install_id` (item
        6), slots resolved once per run."""
        produced: dict[str, InstallFingerprints | None] = {}
        for member, lock in zip(page, locked.members, strict=True):
            install = member.new_pack_install_id
            pack = self.installs[install]
            if lock.row is not None and pack is not None:
                produced[member.link_key] = slot_fingerprints(self.slots, pack, install, lock.row)
        return produced

    async def _audit(self) -> None:
        # OPS-2: the approver is who acted; each entry's before/after is its receipt's.
        approval = self.head.approval
        await q.audit_operation(
            self.conn,
            self.head.operation_id,
            AuditCommand.REVALIDATE_APPLY,
            (approval.approved_by, approval.reason, approval.approval_reference),
        )


def _other_owner(member: RevalidationMember, owner: str) -> Conflict:
    return Conflict(
        link_key=member.link_key,
        reason=ConflictReason.OTHER_OWNER,
        detail=f"link of owner {owner!r}, not the manifest's",
    )


async def _next_page(
    parts: Iterator[Sequence[RevalidationMember]],
) -> Sequence[RevalidationMember] | None:
    """The next PAGE members (None: the manifest has no more) from `parts`, pages of a
    size that divides PAGE, the event loop let in between two: while a page is parsed,
    the page being written and read on the connection sends its next statement."""
    page: list[RevalidationMember] = []
    for part in parts:
        page.extend(part)
        if len(page) >= PAGE:
            break
        await asyncio.sleep(0)
    return page or None


async def _settled(task: asyncio.Future[ReadPage]) -> None:
    """Wait for a page read that may still be running, so no statement is left on the
    connection when its transaction ends; when the caller is failing, its own error is
    the one raised, so the read's outcome is dropped (and marked retrieved)."""
    if not task.done():
        await asyncio.wait([task])
    if not task.cancelled():
        task.exception()
