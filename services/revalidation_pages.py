"""One page of a bulk revalidation's transaction (SPEC §9 REV-2, issue 34): its locked read
and its write, each a few set-wise statements on the caller's connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from db import revalidation as q
from db.records import Conn
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


async def lock_page(conn: Conn, keys: list[str]) -> Locked:
    """Lock and read one page of members: their rows (FOR UPDATE, in link-key order),
    occupying attempts and pointed-at receipts, each set-wise for the page. The owner
    scope lock the run holds keeps every admission, dispatch and operator action of the
    owner out, so no occupying attempt can appear under it (invariant 3)."""
    if not keys:
        return Locked([], {})
    read = await q.link_states_for_update(conn, keys)
    occupying = await q.occupying_attempts(conn, keys)
    rows = {key: locked.state for key, locked in read.items()}
    pointers = {
        key: row.last_mapping_revalidation_operation_id
        for key, row in rows.items()
        if row.last_mapping_revalidation_operation_id is not None
    }
    prior = await q.pointer_receipts(conn, pointers) if pointers else {}
    members = [
        LockedMember(
            link_key=key,
            row=rows.get(key),
            occupying_attempt_ids=occupying.get(key, ()),
            pointer_receipt=prior.get(key),
        )
        for key in keys
    ]
    return Locked(members, {key: locked.version for key, locked in read.items()})


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
