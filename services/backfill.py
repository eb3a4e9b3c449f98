"""Legacy-link adoption (SPEC MIG-1): `plan` reads, `apply` re-plans under locks and inserts.

Both walk every record of the selected action slots' source objects in keyset pages
and let `protocol.backfill` decide each one; each page's decisions go to the caller's
`PageSink` as soon as they are made and are not kept, so memory holds one page whatever
the number of records (NF-7). `plan` writes nothing. `apply` runs one
transaction per page (`services.backfill_adopt`): it never touches attempts or local
records and makes no remote call: adoption never POSTs. An interrupted apply keeps the
pages it committed; re-running it finds their links (`already_adopted`) and adopts the
rest, nothing twice.

Locators claimed by two records are found first by one set-wise query over every slot
of the pack (`db.backfill.contested_candidates`, filtered by the claim rule of
`protocol.backfill_evidence`), so a contested remote id is rejected whichever page (or
`--action-slot` selection) holds its claimants, and no process holds every claim.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from db import backfill as q
from db.records import Conn
from protocol.active import resolve_active
from protocol.backfill import Totals, decide_batch, prepare, totals
from protocol.backfill_defaults import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
from protocol.backfill_defaults import DEFAULT_OPERATOR as DEFAULT_OPERATOR
from protocol.backfill_evidence import claim_fields, is_claim
from protocol.backfill_facts import (
    LegacyRecord,
    Locator,
    Outcome,
    RecordDecision,
    backfill_slot,
)
from protocol.manifest import PackManifest, parse_manifest
from services.backfill_adopt import ActivePackChanged as ActivePackChanged
from services.backfill_adopt import AdoptSlot, apply_page, refuse_adoptions, stored_facts
from services.backfill_adopt import adopted_link_values as adopted_link_values
from services.packs import ActivePack, get_active_pack


class BackfillUnavailable(Exception):
    """Nothing to plan against: no active pack, or an unknown action slot (nothing read)."""


class ProgressSink(Protocol):
    def start(self, total: int) -> None:
        """`total` records will be looked at."""

    def advance(self, records: int) -> None:
        """`records` more were decided."""


class BackfillRun(BaseModel):
    """What a run is about, known before its first page."""

    model_config = ConfigDict(frozen=True)

    connector_owner_key: str
    pack_install_id: str
    applied: bool
    action_slots: tuple[str, ...]


class BackfillSummary(BackfillRun):
    """A finished run: its counts, not its decisions."""

    totals: Totals

    @property
    def rejected(self) -> bool:
        return self.totals.rejected > 0


class PageSink(Protocol):
    def begin(self, run: BackfillRun) -> None:
        """The run starts (nothing read yet beyond the pack)."""

    def page(self, decisions: Sequence[RecordDecision]) -> None:
        """One page's decisions (apply: committed); they are not kept after this."""


class BackfillReport(BackfillRun):
    """A whole run's decisions in memory: for small runs and tests (the CLI streams)."""

    decisions: tuple[RecordDecision, ...]

    @property
    def totals(self) -> Totals:
        return totals(self.decisions)

    @property
    def rejected(self) -> bool:
        return any(d.outcome is Outcome.REJECTED for d in self.decisions)


class _Collect:
    def __init__(self) -> None:
        self.decisions: list[RecordDecision] = []

    def begin(self, run: BackfillRun) -> None:
        pass

    def page(self, decisions: Sequence[RecordDecision]) -> None:
        self.decisions.extend(decisions)


async def plan_backfill(
    conn: Conn,
    owner_key: str,
    action_slots: Sequence[str] = (),
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: ProgressSink | None = None,
) -> BackfillReport:
    """What `apply` would do now, per record; reads only."""
    sink = _Collect()
    done = await stream_backfill(
        conn, owner_key, action_slots, sink, batch_size=batch_size, progress=progress
    )
    return BackfillReport(**_run_fields(done), decisions=tuple(sink.decisions))


async def apply_backfill(
    conn: Conn,
    owner_key: str,
    action_slots: Sequence[str] = (),
    *,
    now: datetime,
    operator: str = DEFAULT_OPERATOR,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: ProgressSink | None = None,
) -> BackfillReport:
    """Adopt every unambiguous record (one transaction per page); idempotent.

    `now` and `operator` stamp the adopted links' operator columns (who and when).
    Raises `ActivePackChanged` if a pack apply lands mid-run (earlier pages stay adopted).
    """
    sink = _Collect()
    done = await stream_backfill(
        conn,
        owner_key,
        action_slots,
        sink,
        batch_size=batch_size,
        progress=progress,
        apply_at=(now, operator),
    )
    return BackfillReport(**_run_fields(done), decisions=tuple(sink.decisions))


def _run_fields(run: BackfillRun) -> dict[str, object]:
    return {name: getattr(run, name) for name in BackfillRun.model_fields}


async def stream_backfill(
    conn: Conn,
    owner_key: str,
    selection: Sequence[str],
    sink: PageSink,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: ProgressSink | None = None,
    apply_at: tuple[datetime, str] | None = None,
) -> BackfillSummary:
    """Plan (`apply_at` None) or apply (at that time, by that operator) page by page,
    handing each page's decisions to `sink`; memory holds one page."""
    pack, slots = await load_slots(conn, owner_key)
    chosen = _select(slots, selection)
    claimed_twice = await _contested(conn, owner_key, slots.values())
    run = BackfillRun(
        connector_owner_key=owner_key,
        pack_install_id=pack.pack_install_id,
        applied=apply_at is not None,
        action_slots=tuple(s.backfill.action_slot_id for s in chosen),
    )
    sink.begin(run)
    if progress is not None:
        objects = [s.backfill.source_object for s in chosen]
        progress.start(sum([await q.count_records(conn, [o]) for o in objects]))
    counts: Counter[str] = Counter()

    def done(decided: Sequence[RecordDecision], records: int) -> None:
        counts.update(d.outcome.value for d in decided)
        sink.page(decided)
        if progress is not None:
            progress.advance(records)

    for slot in chosen:
        source = slot.backfill.source_object
        if apply_at is None:
            async for page in _pages(conn, source, batch_size):
                items = prepare((slot.backfill, r) for r in page)
                decided = decide_batch(items, await stored_facts(conn, items), claimed_twice)
                done(await refuse_adoptions(conn, decided, slot), len(page))
        else:
            async for ids in _id_pages(conn, source, batch_size):
                args = (pack.pack_install_id, slot, ids, claimed_twice, apply_at)
                done(await apply_page(conn, *args), len(ids))
    return BackfillSummary(**_run_fields(run), totals=Totals.model_validate(dict(counts)))


async def load_slots(conn: Conn, owner_key: str) -> tuple[ActivePack, dict[str, AdoptSlot]]:
    """The active install and every action slot of it, with earlier installs' mirror pairs."""
    pack = await get_active_pack(conn, owner_key)
    if pack is None:
        raise BackfillUnavailable(f"owner key {owner_key!r} has no active pack install")
    stored = await q.install_manifests(conn, pack.ancestors)
    earlier = [_manifest(stored[i]) for i in pack.ancestors if i in stored]
    slots: dict[str, AdoptSlot] = {}
    for action in pack.manifest.action_slots:
        active = resolve_active(
            pack.manifest,
            pack.pack_install_id,
            action.id,
            install_ancestors=frozenset(pack.ancestors),
        )
        slots[action.id] = AdoptSlot(
            backfill=backfill_slot(pack.manifest, active, earlier), active=active
        )
    return pack, slots


def _manifest(document: object) -> PackManifest:
    assert isinstance(document, dict), "pack_install.manifest is a JSON object"
    return parse_manifest(document)


def _select(slots: dict[str, AdoptSlot], selection: Sequence[str]) -> list[AdoptSlot]:
    unknown = sorted(set(selection) - set(slots))
    if unknown:
        raise BackfillUnavailable(f"not an action slot of the active pack: {unknown}")
    return [slots[s] for s in sorted(set(selection) or slots)]


async def _pages(conn: Conn, source_object: str, size: int) -> AsyncIterator[list[LegacyRecord]]:
    after: str | None = None
    while page := await q.record_page(conn, source_object, after, size):
        yield page
        after = page[-1].record_id


async def _id_pages(conn: Conn, source_object: str, size: int) -> AsyncIterator[list[str]]:
    """`_pages`' record ids only: apply re-reads the records under its locks."""
    after: str | None = None
    while page := await q.record_id_page(conn, source_object, after, size):
        yield page
        after = page[-1]


async def _contested(conn: Conn, owner_key: str, slots: Iterable[AdoptSlot]) -> frozenset[Locator]:
    """Locators claimed by more than one (slot, record) anywhere in the pack (read-only):
    what `protocol.backfill_evidence.contested` says of every record, found set-wise."""
    fields = [
        (bf.action_slot_id, bf.source_object, bf.destination_slot_id, bf.remote_scope, field)
        for bf in (s.backfill for s in slots)
        for field in claim_fields(bf)
    ]
    return frozenset(
        Locator(
            connector_owner_key=owner_key,
            destination_slot_id=destination,
            remote_scope=scope,
            remote_id=remote_id,
        )
        for destination, scope, remote_id in await q.contested_candidates(conn, fields)
        if is_claim(remote_id)
    )
