"""`pack apply --dry-run` (C-4): what activating a manifest would do to an owner's links,
attempts and create paths, read page by page; nothing is written."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from db import links as links_q
from db import packs as q
from db.records import Conn
from protocol.active import ActiveMetadata, resolve_active
from protocol.drift import Disposition, DriftSurface, Finding, classify, fails_closed
from protocol.installable import check_installable
from protocol.manifest import PackManifest, parse_manifest
from protocol.snapshots import manifest_digest
from services.packs import (
    EXAMPLES,
    claims_refusal,
    create_path_changes,
    pack_of_install,
    previous_manifest,
    unverified_claims,
)
from services.rows import attempt_snapshot, link_snapshot

PREVIEW_INSTALL_ID = "(new install)"
PREVIEW_PAGE = 1000


class Effect(StrEnum):
    """How a drift disposition reads for an operator deciding whether to apply."""

    BENIGN = "benign"
    FAIL_CLOSED = "fail closed"
    MIRROR_BLOCKED = "mirror blocked"
    BLOCKS_CREATES = "blocks creates"


_EFFECTS: dict[Disposition, Effect] = {
    Disposition.BENIGN: Effect.BENIGN,
    Disposition.FROZEN_NO_EFFECT: Effect.BENIGN,
    Disposition.MIRROR_BLOCKED: Effect.MIRROR_BLOCKED,
    Disposition.FAIL_CLOSED: Effect.FAIL_CLOSED,
}


class SurfaceImpact(BaseModel):
    model_config = ConfigDict(frozen=True)

    surface: str
    subject: str  # "links", "attempts" or "creates" (action slots)
    disposition: str
    effect: Effect
    count: int
    examples: tuple[str, ...]


class ApplyPreview(BaseModel):
    model_config = ConfigDict(frozen=True)

    connector_owner_key: str
    manifest_digest: str
    current_pack_install_id: str | None
    unchanged: bool
    links_examined: int = 0
    attempts_examined: int = 0
    links_failing_closed: int = 0
    impacts: tuple[SurfaceImpact, ...] = ()
    # The claims `pack verify` did not find holding (PROF-1..3), and the refusal `pack
    # apply` would answer with them unless the operator accepts them (None: it would not).
    unverified_claims: tuple[str, ...] = ()
    claims_refusal: str | None = None


class _Tally:
    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, Disposition], int] = {}
        self.examples: dict[tuple[str, str, Disposition], list[str]] = {}

    def add(self, subject: str, key: str, findings: list[Finding]) -> None:
        for f in findings:
            slot = (f.surface.value, subject, f.disposition)
            self.counts[slot] = self.counts.get(slot, 0) + 1
            shown = self.examples.setdefault(slot, [])
            if len(shown) < EXAMPLES:
                shown.append(key)

    def impacts(self) -> list[SurfaceImpact]:
        return [
            SurfaceImpact(
                surface=surface,
                subject=subject,
                disposition=disposition.value,
                effect=_EFFECTS[disposition],
                count=count,
                examples=tuple(self.examples[(surface, subject, disposition)]),
            )
            for (surface, subject, disposition), count in sorted(self.counts.items())
        ]


async def preview_apply(
    conn: Conn,
    document: Mapping[str, object] | PackManifest,
    *,
    reinstall: bool = False,
    production: bool = False,
    accept_unverified_claims: bool = False,
) -> ApplyPreview:
    """`pack apply --dry-run`: per drift surface, what activating `document` would do to the
    owner's finalized links and active attempts (the classifier's own verdicts against the
    would-be install), which action slots' creates it would block, and whether apply would
    refuse it for its unverified claims (with `apply_pack`'s arguments of that name). Reads
    only, page by page; writes nothing."""
    manifest = check_installable(
        document if isinstance(document, PackManifest) else parse_manifest(document)
    )
    digest = manifest_digest(manifest)
    owner = manifest.connector_owner_key
    current = await q.select_active_install(conn, owner)
    preview = ApplyPreview(
        connector_owner_key=owner,
        manifest_digest=digest,
        current_pack_install_id=current.pack_install_id if current else None,
        unchanged=current is not None and current.manifest_digest == digest and not reinstall,
    )
    if preview.unchanged:
        return preview  # apply writes nothing, so it refuses nothing either
    problems = await unverified_claims(conn, manifest, production)
    refused = problems and not accept_unverified_claims
    preview = preview.model_copy(
        update={
            "unverified_claims": problems,
            "claims_refusal": str(claims_refusal(problems)) if refused else None,
        }
    )
    ancestors: frozenset[str] = frozenset()
    if current is not None and not reinstall:
        old = await pack_of_install(conn, current)
        ancestors = frozenset({current.pack_install_id, *old.ancestors})
    tally = _Tally()
    resolved: dict[tuple[str, str], ActiveMetadata] = {}

    def active_for(action_slot: str, destination_slot: str) -> ActiveMetadata:
        slot = (action_slot, destination_slot)
        if slot not in resolved:
            resolved[slot] = resolve_active(
                manifest, PREVIEW_INSTALL_ID, action_slot, destination_slot, ancestors
            )
        return resolved[slot]

    links = failing = 0
    after = ""
    while page := await links_q.owner_finalized_links_page(conn, owner, after, PREVIEW_PAGE):
        for row in page:
            link = link_snapshot(row)
            findings = classify(
                link, active_for(link.slot.action_slot_id, row["destination_slot_id"])
            )
            tally.add("links", link.link_key, findings)
            failing += fails_closed(findings)
        links += len(page)
        after = page[-1]["link_key"]
    attempts = 0
    after = ""
    while page := await links_q.owner_active_attempts_page(conn, owner, after, PREVIEW_PAGE):
        for row in page:
            attempt = attempt_snapshot(row)
            slot = attempt.slot
            findings = classify(attempt, active_for(slot.action_slot_id, slot.destination_slot_id))
            tally.add("attempts", attempt.link_key, findings)
        attempts += len(page)
        after = page[-1]["link_key"]
    impacts = tally.impacts()
    changed = create_path_changes(previous_manifest(current), manifest)
    if changed:
        impacts.append(
            SurfaceImpact(
                surface=DriftSurface.CREATE_PATH.value,
                subject="creates",
                disposition="blocked_until_validated",
                effect=Effect.BLOCKS_CREATES,
                count=len(changed),
                examples=tuple(slot for slot, _, _ in changed[:EXAMPLES]),
            )
        )
    return preview.model_copy(
        update={
            "links_examined": links,
            "attempts_examined": attempts,
            "links_failing_closed": failing,
            "impacts": tuple(impacts),
        }
    )
