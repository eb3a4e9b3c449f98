"""Planning a §9 revalidation manifest (read-only: release engineers' plan -> validate ->
apply, SPEC REV-1): which finalized links an install's fingerprints would move."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, ValidationError

from db import packs as packs_q
from db import revalidation as q
from db import revalidation_owner as owner_q
from db.packs import PackInstallRow
from db.records import Conn
from protocol.link_row import LinkRowState, plan_member
from protocol.manifest import ManifestInvalid, PackManifest
from protocol.manifest import parse_manifest as parse_pack_manifest
from protocol.revalidation import InstallFingerprints
from protocol.revalidation_lines import ManifestWriter, header_for
from protocol.revalidation_manifest import (
    Approval,
    ManifestHead,
    ManifestRejected,
    RevalidationManifest,
    RevalidationMember,
    build_manifest,
)
from protocol.states import LinkStatus
from services.revalidation_installs import SlotFingerprints, slot_fingerprints


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
    """A canonical manifest (in memory) moving the links to the install's fingerprints."""
    members: list[RevalidationMember] = []
    async with _snapshot(conn):
        async for page in _planned_pages(conn, request):
            members.extend(page)
    return build_manifest(request.operation_id, request.approval, members)


async def write_plan(conn: Conn, request: PlanRequest, out: BinaryIO) -> ManifestHead:
    """The same plan written to `out` as a JSON Lines manifest (protocol.revalidation_lines),
    a page at a time: memory bounded by a page, not by the owner's link count. The pages
    are read from one snapshot, so the manifest is one consistent moment of the links."""
    async with _snapshot(conn):
        _, pack = await _install(conn, request)
        header = header_for(request.operation_id, pack.connector_owner_key, request.approval)
        writer = ManifestWriter(header)
        out.write(writer.start())
        async for page in _planned_pages(conn, request):
            out.write(b"".join(writer.member(member) for member in page))
    try:
        trailer, head = writer.finish()
    except ManifestRejected:
        raise PlanError("no finalized link would move") from None
    out.write(trailer)
    return head


# Links read and planned per page (a page of rows and its members are what is in memory).
PLAN_PAGE = 5000


def _snapshot(conn: Conn) -> AbstractAsyncContextManager[object]:
    """One read-only snapshot for every page (or the caller's transaction, if in one)."""
    if conn.is_in_transaction():
        return nullcontext()
    return conn.transaction(isolation="repeatable_read", readonly=True)


async def _install(conn: Conn, request: PlanRequest) -> tuple[PackInstallRow, PackManifest]:
    install = await packs_q.select_install(conn, request.new_pack_install_id)
    if install is None:
        raise PlanError(f"no pack install {request.new_pack_install_id}")
    try:
        return install, parse_pack_manifest(install.manifest)
    except ManifestInvalid as error:
        raise PlanError(f"install {install.pack_install_id}: {error}") from error


async def _planned_pages(
    conn: Conn, request: PlanRequest
) -> AsyncIterator[list[RevalidationMember]]:
    """The members that move, in link-key order, a page at a time; PlanError when none."""
    install, pack = await _install(conn, request)
    install_id = install.pack_install_id
    slots: SlotFingerprints = {}
    moved = 0
    async for rows in _planned_rows(conn, request, pack.connector_owner_key):
        members = [planned_member(slot_fingerprints(slots, pack, install_id, row), install_id, row)
                   for row in rows]  # fmt: skip
        moving = [m for m in members if not m.changes_nothing]
        if request.link_keys is not None and len(moving) != len(members):
            idle = sorted({m.link_key for m in members} - {m.link_key for m in moving})
            raise PlanError(f"already at the install's fingerprints: {', '.join(idle)}")
        moved += len(moving)
        yield moving
    if not moved:
        raise PlanError("no finalized link would move")


async def _planned_rows(
    conn: Conn, request: PlanRequest, owner: str
) -> AsyncIterator[list[LinkRowState]]:
    if request.link_keys is None:
        after = ""
        while page := await owner_q.finalized_link_states_page(conn, owner, after, PLAN_PAGE):
            yield page
            after = page[-1].link_key
        return
    rows = await q.link_states(conn, sorted(set(request.link_keys)))
    missing = sorted(set(request.link_keys) - {row.link_key for row in rows})
    if missing:
        raise PlanError(f"no link {', '.join(missing)}")
    for row in rows:
        if row.status != LinkStatus.FINALIZED or row.connector_owner_key != owner:
            raise PlanError(f"{row.link_key}: {row.status} link of owner {row.connector_owner_key}")
    yield rows


def planned_member(
    produced: InstallFingerprints | None, install_id: str, row: LinkRowState
) -> RevalidationMember:
    """The manifest member moving `row` to what its install produces (`produced`)."""
    if produced is None:
        raise PlanError(f"{row.link_key}: action slot {row.action_slot_id!r} is not in the pack")
    try:
        return plan_member(row, produced.mapping_fingerprint, produced.body_fingerprint, install_id)
    except ValidationError as error:
        raise PlanError(f"{row.link_key}: not plannable ({error.errors()[0]['msg']})") from None
