"""One page of a bulk revalidation's transaction (REV-2, NF-7): its locked read
and its write, each a few set-wise statements on the caller's connection."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

from asyncpg import Record

from db import revalidation as q
from db.records import Conn
from protocol.link_row import LinkRowState
from protocol.revalidation import Conflict, ConflictReason, LockedMember, RevalidationReceipt
from protocol.revalidation_manifest import ManifestHead, RevalidationMember


class CasLost(Exception):
    """A member's row moved under its lock: roll the whole manifest back (invariant 4)."""

    def __init__(self, conflict: Conflict) -> None:
        super().__init__(conflict.detail)
        self.conflict = conflict


class PageWrite(NamedTuple):
    page: Sequence[RevalidationMember]
    receipts: list[RevalidationReceipt]
    versions: dict[str, int]


class Locked(NamedTuple):
    members: list[LockedMember]
    versions: dict[str, int]  # the row_version each existing member's row was read at


class ReadPage(NamedTuple):
    """One page's locked read as Postgres returned it; `locked_page` makes it models."""

    keys: list[str]
    rows: list[Record]
    occupying: dict[str, tuple[str, ...]]
    receipts: list[Record]  # the receipts the rows' pointers name


# Rows made models (or members judged) between two chances for a page being written or
# read on the connection to send its next statement.
PER_YIELD = 100


async def read_page(conn: Conn, keys: list[str]) -> ReadPage:
    """Lock and read one page of members: their rows (FOR UPDATE, in link-key order),
    occupying attempts and pointed-at receipts, each set-wise for the page. Statements
    only: Postgres is the slower side of a page, so the rows are made models
    by the caller while the connection writes and reads the pages either side. The owner
    scope lock the run holds keeps every admission, dispatch and operator action of the
    owner out, so no occupying attempt can appear under it (invariant 3)."""
    if not keys:
        return ReadPage(keys, [], {}, [])
    rows = await q.rows_for_update(conn, keys)
    occupying = await q.occupying_attempts(conn, keys)
    pointers = {
        row["link_key"]: pointer
        for row in rows
        if (pointer := row["last_mapping_revalidation_operation_id"]) is not None
    }
    receipts = await q.pointer_receipt_rows(conn, pointers) if pointers else []
    return ReadPage(keys, rows, occupying, receipts)


async def locked_page(read: ReadPage) -> Locked:
    """The page's rows, occupancy and pointed-at receipts as models, yielding to the
    event loop every PER_YIELD rows."""
    rows: dict[str, LinkRowState] = {}
    versions: dict[str, int] = {}
    for n, locked in enumerate(q.locked_rows(read.rows)):
        if n % PER_YIELD == 0:
            await asyncio.sleep(0)
        rows[locked.state.link_key] = locked.state
        versions[locked.state.link_key] = locked.version
    prior = q.receipts_by_link(read.receipts)
    members = [
        LockedMember(
            link_key=key,
            row=rows.get(key),
            occupying_attempt_ids=read.occupying.get(key, ()),
            pointer_receipt=prior.get(key),
        )
        for key in read.keys
    ]
    return Locked(members, versions)


async def write_page(
    conn: Conn,
    head: ManifestHead,
    page: Sequence[RevalidationMember],
    receipts: list[RevalidationReceipt],
    versions: dict[str, int],
) -> None:
    """One page's receipts (COPY) and link moves (one UPDATE ... FROM unnest)."""
    who = (head.approval.approved_by, head.approval.reason)
    # The receipts first: the links' new pointers reference them.
    await q.insert_receipts(conn, receipts)
    # Written only when no member so far conflicted: each one's row exists, with a version.
    members = list(page)
    read_at = [versions[member.link_key] for member in members]
    moved = await q.move_links_mapping(conn, members, read_at, head.operation_id, who)
    for member in members:
        check_moved(member.link_key, moved.get(member.link_key))


def check_moved(link_key: str, as_planned: bool | None) -> None:
    """The moved row is the after-state its receipt's digest was computed from: the tuple
    read under the lock (same row_version), with only the planned values moved."""
    if not as_planned:
        detail = (
            "compare-and-set matched no row" if as_planned is None else "row changed under its lock"
        )
        raise CasLost(Conflict(link_key=link_key, reason=ConflictReason.CAS_LOST, detail=detail))
