"""The side-path actors: configuration changes, two creators, prune, revalidation,
expiring keys and slow answers while creates and PATCHes are in flight (SPEC §17; the
`slow_answer` path is also among the re-drawn sandbox fault rules, faults.py).

Each counts what it did under `side_paths` in the campaign's JSON; what the product
answered is kept apart (`side_path_answers`), since a refusal is often the right answer.
A path the family cannot walk (`Family.not_applicable`) does not run, and the JSON says
why under `side_paths_not_applicable` instead of counting it.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from bench.chaos.actors import OPERATOR, Traffic, run_cli
from bench.chaos.config import Family
from bench.chaos.faults import SandboxFaults
from bench.chaos.packs import (
    UPGRADE,
    VARIANTS,
    Manifest,
    apply_legacy,
    campaign_manifest,
    unkeyed_targets,
    variant,
)
from protocol.drift import INSTALL_REASONS
from sandbox.faults import FaultRuleSpec

SIDE_PATHS = (
    "pack_apply",
    "two_slot_save",
    "prune",
    "revalidate_owner",
    "key_expired_resend",
    "slow_answer",
)
PRUNE_AGE_S = 30  # `prune --older-than`: longer than the sampler's gap (sampler.py)
SUSPENDED_SQL = """
SELECT link_key FROM connector_remote_link WHERE status = 'suspended_drift'
ORDER BY random() LIMIT $1
"""
# A link of the slot the `slot_removed` variant removes, for the `revalidate_owner`
# episode: one already suspended for an install change alone first, else a finalized one.
SLOT_LINK_SQL = """
SELECT link_key, status FROM connector_remote_link
WHERE connector_owner_key = $1 AND action_slot_id = $2
  AND (status = 'finalized' OR suspend_reason = ANY($3::text[]))
ORDER BY status = 'finalized', random() LIMIT 1
"""
LINK_STATE_SQL = "SELECT status, suspend_reason FROM connector_remote_link WHERE link_key = $1"
# How long the removal stays active after `revalidate owner`: two of the sampler's looks
# past its grace (sampler.py), so a link restored under the removed slot is seen.
REMOVAL_HOLD_S = 8.0
SLOT_LINK_TRIES = 5
DRIP_MS = 600  # a create's answer (~240 bytes) then takes minutes: past any deadline


@dataclass
class SidePaths:
    """One seeded loop per side path, all for the chaos phase's duration."""

    traffic: Traffic
    sandbox_faults: SandboxFaults
    rng: random.Random
    counts: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    _episode: int = 0
    # One configuration episode at a time: each ends with the base pack active again.
    _packs: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def family(self) -> Family:
        return self.traffic.stack.family

    @property
    def base(self) -> Manifest:
        return campaign_manifest(self.family, self.traffic.stack.sandbox.url)

    async def run(self, until: float) -> None:
        loops = [
            self._every(until, (15, 30), self.pack_episode),
            self._every(until, (40, 70), self.removal_episode),
            self._every(until, (2, 5), self.two_slot_save),
            self._every(until, (15, 25), self.prune),
            self._every(until, (15, 30), self.slow_answer),
        ]
        if "key_expired_resend" not in self.family.not_applicable:
            loops.append(self._every(until, (25, 40), self.key_expired_resend))
        await asyncio.gather(*loops)

    async def _every(
        self, until: float, gap: tuple[float, float], step: Callable[[], Awaitable[None]]
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.rng.uniform(*gap))
            if loop.time() >= until:  # no episode starts after the chaos phase
                return
            try:
                await step()
            except Exception as error:  # the campaign outlives any one action
                self.answers[f"error_{type(error).__name__}"] += 1

    async def _apply(self, manifest: Manifest, reinstall: bool, what: str) -> None:
        pool: asyncpg.Pool = self.traffic.pool
        async with pool.acquire() as conn:
            outcome = await apply_legacy(conn, manifest, reinstall=reinstall)
        self.counts["pack_apply"] += 1
        self.answers[f"pack_apply_{what}_{outcome.value}"] += 1

    async def pack_episode(self) -> None:
        """One surface changed while creates and PATCHes are in flight, then the base pack
        again (a removed slot recreated); revalidation before or after the restore."""
        async with self._packs:
            name = self.rng.choice(VARIANTS)
            changed, reinstall = variant(self.family, self.base, name)
            await self._apply(changed, reinstall, name)
            early = self.rng.random() < 0.5
            await asyncio.sleep(self.rng.uniform(3, 10))
            if early:  # with the change still active: a removed slot must stay suspended
                await self.revalidate()
            await self._apply(self.base, False, "restore")
            await asyncio.sleep(self.rng.uniform(1, 4))
            await self.revalidate()

    async def removal_episode(self) -> None:
        """G-4's episode, every time: a link of the slot `slot_removed` removes is
        suspended for an install change alone (a new install, then a save on the link),
        the slot is removed, and `revalidate owner` runs with the removal active: it must
        leave that link suspended (rule 1). Then the base pack, and revalidation again."""
        slot = self.family.variants.slot_removed
        async with self._packs:
            await self._apply(variant(self.family, self.base, UPGRADE)[0], False, UPGRADE)
            await self._suspend_for_install(slot)
            await self._apply(variant(self.family, self.base, "slot_removed")[0], False, "removal")
            await self.revalidate()
            await asyncio.sleep(REMOVAL_HOLD_S)
            await self._apply(self.base, False, "restore")
            await self.revalidate()

    async def _suspend_for_install(self, slot: str) -> None:
        """A link under `slot` suspended for the install change alone: one already is, or
        a save on a finalized one (validated under an earlier install) suspends it
        (DRIFT-2); a link finalized under a changed surface (an endpoint variant's) is
        suspended for that instead, so up to `SLOT_LINK_TRIES` are saved. The answer
        names the last link's state, or that the slot had no link yet."""
        for _ in range(SLOT_LINK_TRIES):
            args = (self.family.owner, slot, list(INSTALL_REASONS))
            async with self.traffic.pool.acquire() as conn:
                row = await conn.fetchrow(SLOT_LINK_SQL, *args)
            if row is None:
                self.answers["removal_no_link_yet"] += 1
                return
            key = row["link_key"]
            if row["status"] == "finalized":
                record = self.traffic.world.record(key)
                await self.traffic.edit(record)
                await self.traffic.save(record, cli=False)
            async with self.traffic.pool.acquire() as conn:
                state = await conn.fetchrow(LINK_STATE_SQL, key)
            assert state is not None  # links are never deleted
            reached = state["suspend_reason"] or state["status"]
            if reached in INSTALL_REASONS:
                break
        self.answers[f"removal_link_{reached}"] += 1

    async def revalidate(self) -> None:
        """`revalidate owner` for the whole owner, then `revalidate-link` on a suspended link."""
        self._episode += 1
        code, _, _ = await run_cli(
            self.traffic.stack,
            *("revalidate", "owner", "--owner-key", self.family.owner),
            *("--approved-by", OPERATOR),
            *("--approval-reference", f"CHAOS-{self._episode}", "--reason", "chaos campaign"),
            *("--include-mapping-changes", "--json"),
        )
        self.counts["revalidate_owner"] += 1
        self.answers[f"revalidate_owner_exit_{code}"] += 1
        async with self.traffic.pool.acquire() as conn:
            keys = [r["link_key"] for r in await conn.fetch(SUSPENDED_SQL, 2)]
        for key in keys:
            code, _, _ = await run_cli(
                self.traffic.stack,
                *("revalidate-link", key, "--operator", OPERATOR, "--reason", "chaos", "--json"),
            )
            self.counts["revalidate_owner"] += 1
            self.answers[f"revalidate_link_exit_{code}"] += 1

    async def two_slot_save(self) -> None:
        """One Contact record saved under both contact slots at once (G-2)."""
        world = self.traffic.world
        record = self.rng.choice(world.records[self.family.contacts])
        await asyncio.gather(
            self.traffic.save(record, cli=False),
            self.traffic.save(world.second_slot(record), cli=False),
        )
        self.counts["two_slot_save"] += 1

    async def prune(self) -> None:
        code, _, _ = await run_cli(
            self.traffic.stack,
            *("prune", "--older-than", f"{PRUNE_AGE_S}s", "--keep-patches", "1"),
            *("--operator", OPERATOR, "--reason", "chaos campaign", "--json"),
        )
        self.counts["prune"] += 1
        self.answers[f"prune_exit_{code}"] += 1

    async def slow_answer(self) -> None:
        """Answers dripped past the request's deadline (G-7) on the creates whose profile
        declares no idempotency key and on PATCHes, for a few seconds: a request cut after
        it was sent may have landed, and re-sending it there would write twice."""
        faults = self.sandbox_faults
        targets = unkeyed_targets(self.family, self.base)
        async with faults.lock:
            if not self.traffic.stack.sandbox.up:
                return
            await faults.harvest()
            await faults.arm(
                [
                    FaultRuleSpec(
                        method=method,
                        path=path,
                        probability=0.5,
                        seed=self.rng.getrandbits(32),
                        action="drip_after_effect",
                        drip_ms=DRIP_MS,
                    )
                    for method, path in targets
                ]
            )
            await asyncio.sleep(self.rng.uniform(3, 6))
            await faults.harvest()  # the drips that fired count under `slow_answer`

    async def key_expired_resend(self) -> None:
        """Contact creates land and lose their answer, then the remote is away for longer
        than the key retention: each re-send would meet a forgotten key (G-5)."""
        faults = self.sandbox_faults
        stack = self.traffic.stack
        retention_s = self.family.key_retention_s
        assert retention_s is not None  # `run` leaves this path out without a key
        async with faults.lock:
            if not stack.sandbox.up:
                return
            await faults.harvest()
            rule = FaultRuleSpec(
                method="POST",
                path=self.family.post_paths[0],  # the contacts'
                probability=0.6,
                action="reset_after_effect",
            )
            await faults.arm([rule])
            await asyncio.sleep(self.rng.uniform(2, 4))
            await faults.harvest()
            stack.sandbox.kill()
            await asyncio.sleep(retention_s + self.rng.uniform(2, 6))
            await asyncio.to_thread(stack.sandbox.start)
        self.counts["key_expired_resend"] += 1
