"""Evidence sampled during the run, for what the end state cannot show.

Every few seconds, in one repeatable-read transaction: each attempt and PATCH with its
status and how many journal rows it has, and the finalized links with the active pack.

- `evidence_deleted` (G-3): an attempt row gone, an attempt's journal shrinking, or a
  PATCH seen unfinished gone or its journal shrinking before the next sample. Prune
  deletes only rows finished longer than `PRUNE_AGE_S` ago, so a PATCH unfinished at
  one sample and gone at the next one taken sooner than that was deleted unfinished.
- `finalized_under_missing_slot` (C-9, G-4): a finalized link whose action or
  destination slot the active pack (active for longer than the gate's grace) lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from bench.chaos.gate_check import GRACE, violation
from bench.chaos.side_paths import PRUNE_AGE_S
from protocol.manifest import parse_manifest

EVERY_S = 3.0
FINISHED_PATCH = {"succeeded", "failed", "superseded"}
COUNTS_SQL = """
SELECT 'attempt' AS kind, a.attempt_id::text AS id, a.status, a.link_key,
       count(j.journal_id) AS n
FROM connector_push_attempt a LEFT JOIN connector_send_journal j ON j.attempt_id = a.attempt_id
GROUP BY a.attempt_id
UNION ALL
SELECT 'patch', p.patch_id::text, p.status, p.link_key, count(j.journal_id)
FROM connector_patch_dispatch p LEFT JOIN connector_send_journal j ON j.patch_id = p.patch_id
GROUP BY p.patch_id
"""
ACTIVE_SQL = """
SELECT manifest::text AS manifest, activated_at, now() AS now FROM pack_install WHERE active
"""
FINALIZED_SQL = """
SELECT link_key, action_slot_id, destination_slot_id FROM connector_remote_link
WHERE status = 'finalized'
"""

Row = dict[str, Any]


@dataclass
class Sampler:
    dsn: str
    samples: int = 0
    violations: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    _last: dict[tuple[str, str], Row] = field(default_factory=dict)
    _last_at: datetime | None = None
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        """Sample every `EVERY_S` until `stop` (a sample in progress is finished: one
        cancelled mid-query leaves asyncpg's connection in a state it refuses to close)."""
        while not self._stopped.is_set():
            try:
                await self.sample()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                self._last_at = None  # Postgres restarting: the next gap is not judged
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), EVERY_S)

    def stop(self) -> None:
        self._stopped.set()

    async def sample(self) -> None:
        conn = await asyncpg.connect(self.dsn, timeout=10)
        try:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                counts = [dict(r) for r in await conn.fetch(COUNTS_SQL)]
                active = await conn.fetchrow(ACTIVE_SQL)
                finalized = [dict(r) for r in await conn.fetch(FINALIZED_SQL)]
        finally:
            await conn.close()
        if active is None:
            return
        now: datetime = active["now"]
        current = {(r["kind"], r["id"]): r for r in counts}
        judged = self._last_at is not None and now - self._last_at < timedelta(
            seconds=PRUNE_AGE_S - 5
        )
        if judged:
            self._deleted(current)
        self._last, self._last_at = current, now
        if now - active["activated_at"] > GRACE:
            self._slots(json.loads(active["manifest"]), finalized)
        self.samples += 1

    def _deleted(self, current: dict[tuple[str, str], Row]) -> None:
        for ident, before in self._last.items():
            kind, status = ident[0], before["status"]
            if kind == "patch" and status in FINISHED_PATCH:
                continue  # settled: OPS-3 retention may delete it
            now = current.get(ident)
            if now is None:
                self._flag(ident, before, f"{kind} {ident[1]} ({status}) deleted")
            elif now["n"] < before["n"]:
                self._flag(
                    ident,
                    before,
                    f"{kind} {ident[1]} ({status}) journal rows {before['n']} -> {now['n']}",
                )

    def _flag(self, ident: tuple[str, str], row: Row, detail: str) -> None:
        self.violations.setdefault(ident, violation("evidence_deleted", row["link_key"], detail))

    def _slots(self, manifest: dict[str, Any], finalized: list[Row]) -> None:
        pack = parse_manifest(manifest)
        for link in finalized:
            action = pack.action_slot(link["action_slot_id"])
            if action is None or pack.destination_slot(link["destination_slot_id"]) is None:
                ident = ("slot", link["link_key"])
                self.violations.setdefault(
                    ident,
                    violation(
                        "finalized_under_missing_slot",
                        link["link_key"],
                        f"finalized while the active pack lacks slot {link['action_slot_id']!r}"
                        f" or {link['destination_slot_id']!r}",
                    ),
                )

    def found(self) -> list[dict[str, object]]:
        return list(self.violations.values())
