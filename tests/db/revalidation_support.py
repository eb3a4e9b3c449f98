"""Shared setup for the bulk revalidation db tests: three finalized links on one install, real
installs to move them to, a planner and a whole-database snapshot."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from db import revalidation as q
from protocol.link_row import (
    LinkRowState,
    plan_member,
)
from protocol.manifest import parse_manifest as parse_pack
from protocol.revalidation import ConflictReason, RevalidationResult, RevalidationStatus
from protocol.revalidation_manifest import (
    Approval,
    RevalidationManifest,
    build_manifest,
)
from protocol.states import AttemptStatus
from services.revalidation import install_fingerprints
from tests.db.rows import (
    insert_attempt,
    insert_link,
    insert_pack_install,
    pack_document,
    rows_from_before_0090,
    set_status,
)

S = RevalidationStatus
C = ConflictReason
APPROVAL = Approval(approved_by="alice", approval_reference="CHG-42", reason="mapping v2")
Entry = Callable[[asyncpg.Connection, RevalidationManifest], Awaitable[RevalidationResult]]


def hex64(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


# Real installs to move to, each mapping more properties (so each moves the fingerprints).
TARGETS = {"2": ("email",), "3": ("email", "phone"), "4": ("email", "phone", "lastname")}


@dataclass
class Links:
    keys: list[str]
    old_pack: uuid.UUID
    installs: dict[str, uuid.UUID]

    @property
    def new_pack(self) -> uuid.UUID:
        return self.installs["2"]


@pytest.fixture
async def links(conn: asyncpg.Connection) -> Links:
    return await make_links(conn)


async def make_links(conn: asyncpg.Connection) -> Links:
    """Three finalized links on one install, with sha256 fingerprints as real links carry."""
    old_pack = await insert_pack_install(conn)
    installs = {to: await insert_pack_install(conn, pack_document(*p)) for to, p in TARGETS.items()}
    keys = sorted([await insert_link(conn, old_pack) for _ in range(3)])
    await conn.execute(
        "UPDATE connector_remote_link SET mapping_fingerprint = $1, body_fingerprint = $2",
        hex64("m1"),
        hex64("b1"),
    )
    return Links(keys, old_pack, installs)


def produced(links: Links, to: str, row: LinkRowState) -> tuple[str, str]:
    """The fingerprints install `to` produces for `row` (what a plan must carry)."""
    fingerprints = install_fingerprints(
        parse_pack(pack_document(*TARGETS[to])), str(links.installs[to]), row
    )
    assert fingerprints is not None
    return fingerprints.mapping_fingerprint, fingerprints.body_fingerprint


async def plan(
    conn: asyncpg.Connection, links: Links, keys: list[str], op: str = "op-1", to: str = "2"
) -> RevalidationManifest:
    rows = await q.link_states(conn, keys)
    new = str(links.installs[to])
    members = [plan_member(r, *produced(links, to, r), new) for r in rows]
    return build_manifest(op, APPROVAL, members)


async def state(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every link row (row_version, updated_at included) and every receipt."""
    link_rows = await conn.fetch("SELECT * FROM connector_remote_link ORDER BY link_key")
    receipts = await conn.fetch(
        "SELECT * FROM connector_link_revalidation_receipt ORDER BY operation_id, link_key"
    )
    return [dict(r) for r in link_rows], [dict(r) for r in receipts]


def reasons(result: RevalidationResult) -> list[tuple[str, ConflictReason]]:
    assert result.status is S.REJECTED, result
    return [(c.link_key, c.reason) for c in result.conflicts]


A = AttemptStatus
# Legal walks from `pending` (protocol/states.py ATTEMPT_TRANSITIONS).
WALKS: dict[AttemptStatus, list[AttemptStatus]] = {
    A.PENDING: [],
    A.PROCESSING: [A.PROCESSING],
    A.AMBIGUOUS_REMOTE_EFFECT: [A.PROCESSING, A.AMBIGUOUS_REMOTE_EFFECT],
    A.TERMINAL_FAILED: [A.TERMINAL_FAILED],
    A.SUPERSEDED: [A.TERMINAL_FAILED, A.SUPERSEDED],
}


async def attempt_at(
    conn: asyncpg.Connection, links: Links, key: str, status: AttemptStatus
) -> uuid.UUID:
    async with rows_from_before_0090(conn):
        attempt = await insert_attempt(conn, links.old_pack, link_key=key)
    for step in WALKS[status]:
        await set_status(conn, "attempt", attempt, step.value)
    return attempt
