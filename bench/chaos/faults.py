"""Fault injection: seeded sandbox fault rules (cheap, many) and process faults (a few a minute).

Sandbox faults are counted when they *fire* (the sandbox's per-rule counters),
not when they are armed; each process fault counts once.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import httpx

from bench.chaos.config import Family
from bench.chaos.stack import ChaosStack
from sandbox.client import SandboxClient
from sandbox.faults import FaultRuleSpec, FaultRuleView
from workflows.link_retries import REMOTE_RETRY

# Which requests a rule hits is the family's (`Family.fault_targets`).
RULE_KINDS = {
    "reset_before_effect": 3,
    "reset_after_effect": 3,
    "hang_after_effect": 2,
    "status_5xx": 3,
    "status_not_applied": 3,  # a status the pack declares not applied (429, 423, 400...)
    "latency": 1,
    "drip_after_effect": 3,  # the `slow_answer` side path
}
CYCLE_S = 4.0  # sandbox rules are re-drawn this often
RULES_PER_CYCLE = 10


def retry_budget() -> timedelta:
    """How long the workflow keeps retrying a remote step (REMOTE_RETRY's backoff sum)."""
    assert REMOTE_RETRY.maximum_attempts and REMOTE_RETRY.maximum_interval
    total, interval = timedelta(), REMOTE_RETRY.initial_interval
    for _ in range(REMOTE_RETRY.maximum_attempts - 1):
        total += min(interval, REMOTE_RETRY.maximum_interval)
        interval = interval * REMOTE_RETRY.backoff_coefficient
    return total


def rule_kind(rule: FaultRuleSpec) -> str:
    if rule.action == "status":
        return "status_5xx" if (rule.status or 0) >= 500 else f"status_{rule.status}"
    return "latency" if rule.action == "delay_ms" else rule.action


def draw_rule(rng: random.Random, kind: str, probability: float, family: Family) -> FaultRuleSpec:
    method, path = rng.choice(family.fault_targets)
    base = {"method": method, "path": path, "probability": probability, "seed": rng.getrandbits(32)}
    match kind:
        case "status_5xx":
            return FaultRuleSpec(**base, action="status", status=rng.choice([500, 502, 503, 504]))
        case "status_not_applied":
            statuses = family.not_applied_statuses
            status = statuses[0] if len(statuses) == 1 else rng.choice(statuses)
            if status != 429:
                return FaultRuleSpec(**base, action="status", status=status)
            retry_after = rng.choice(["1", "2"])
            return FaultRuleSpec(**base, action="status", status=429, retry_after=retry_after)
        case "hang_after_effect":
            # Past the product's HTTP timeout (10 s) the client gives up; shorter hangs reset.
            hang_ms = rng.choice([1500, 4000, 12_000])
            return FaultRuleSpec(**base, action="hang_after_effect", hang_ms=hang_ms)
        case "drip_after_effect":
            # Applied, then the answer's body a byte every drip_ms: a slow, healthy remote
            # whose whole answer may outlast the request's deadline (G-7).
            drip_ms = rng.choice([20, 150, 600])
            return FaultRuleSpec(**base, action="drip_after_effect", drip_ms=drip_ms)
        case "latency":
            return FaultRuleSpec(**base, action="delay_ms", delay_ms=rng.randint(100, 1500))
        case _:
            return FaultRuleSpec(**base, action=kind)


@dataclass
class FaultTally:
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, n: int = 1) -> None:
        if n:
            self.counts[kind] += n

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


class SandboxFaults:
    """Arms seeded rules on the running sandbox and harvests what fired."""

    def __init__(self, stack: ChaosStack, rng: random.Random, tally: FaultTally) -> None:
        self._stack = stack
        self._rng = rng
        self._tally = tally
        self.lock = asyncio.Lock()  # held while the sandbox is down or being steered
        self._http = httpx.AsyncClient(timeout=5.0)
        self._admin = SandboxClient(stack.sandbox.url, self._http)

    async def close(self) -> None:
        await self._http.aclose()

    async def harvest(self) -> None:
        """Count fired rules and drop them (the caller holds `lock`)."""
        try:
            rules: list[FaultRuleView] = await self._admin.faults()
            await self._admin.clear_faults()
        except httpx.HTTPError:
            return  # the sandbox is down: its rules died with it, uncounted
        for rule in rules:
            self._tally.add(rule_kind(rule), rule.fired)

    async def arm(self, rules: list[FaultRuleSpec]) -> None:
        for rule in rules:
            try:
                await self._admin.add_fault(rule)
            except httpx.HTTPError:
                return

    def draw(self) -> list[FaultRuleSpec]:
        kinds = self._rng.choices(list(RULE_KINDS), list(RULE_KINDS.values()), k=RULES_PER_CYCLE)
        family = self._stack.family
        return [draw_rule(self._rng, k, self._rng.uniform(0.3, 0.6), family) for k in kinds]

    async def burst_before_outage(self) -> None:
        """Make POSTs land and lose their answer right before the remote goes away
        (issue 10 problem 1: a reset after effect, then connection refused)."""
        async with self.lock:
            await self.harvest()
            rules = [
                FaultRuleSpec(
                    method="POST", path=path, probability=0.7, action="reset_after_effect"
                )
                for path in self._stack.family.post_paths
            ]
            await self.arm(rules)

    async def run(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            async with self.lock:
                if self._stack.sandbox.up:
                    await self.harvest()
                    await self.arm(self.draw())
            await asyncio.sleep(CYCLE_S)

    async def off(self) -> None:
        async with self.lock:
            await self.harvest()


class ProcessFaults:
    """Worker SIGKILLs, Temporal and Postgres restarts, and the remote going down."""

    def __init__(
        self,
        stack: ChaosStack,
        rng: random.Random,
        tally: FaultTally,
        sandbox_faults: SandboxFaults,
    ) -> None:
        self._stack = stack
        self._rng = rng
        self._tally = tally
        self._sandbox_faults = sandbox_faults

    async def kill_workers(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        workers = self._stack.workers
        while loop.time() < until:
            await asyncio.sleep(self._rng.uniform(12, 25))
            slots = list(range(workers.size))
            victims = slots if self._rng.random() < 0.1 else [self._rng.choice(slots)]
            for slot in victims:
                workers.sigkill(slot)
                self._tally.add("worker_sigkill")
            await asyncio.sleep(self._rng.uniform(0.5, 5))
            for slot in victims:
                workers.start(slot)

    async def revive_workers(self, until: float | None = None) -> None:
        """Restart workers that died on their own (a worker exits if Temporal is down)."""
        loop = asyncio.get_running_loop()
        while until is None or loop.time() < until:
            self._stack.workers.revive()
            await asyncio.sleep(2)

    async def restarts(self, until: float, long_outages: list[float]) -> None:
        """One process fault at a time: short remote outages, Temporal and Postgres
        restarts, and the scheduled outages longer than the retry budget."""
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            await asyncio.sleep(self._rng.uniform(6, 16))
            if long_outages and loop.time() >= long_outages[0]:
                long_outages.pop(0)
                await self._remote_down_beyond_budget()
                continue
            kind = self._rng.choices(["remote_down", "temporal", "postgres"], [4, 1, 1])[0]
            if kind == "remote_down":
                await self._remote_down(self._rng.uniform(2, 12), "remote_down")
            elif kind == "temporal":
                await self._stack.restart_temporal()
                self._tally.add("temporal_restart")
            else:
                await self._stack.restart_postgres()
                self._tally.add("postgres_restart")

    async def _remote_down(self, seconds: float, kind: str) -> None:
        sandbox = self._sandbox_faults
        async with sandbox.lock:
            await sandbox.harvest()
            self._stack.sandbox.kill()
            self._tally.add(kind)
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self._stack.sandbox.start)

    async def _remote_down_beyond_budget(self) -> None:
        await self._sandbox_faults.burst_before_outage()
        await asyncio.sleep(5)
        outage = retry_budget().total_seconds() + 20
        await self._remote_down(outage, "remote_down_beyond_retry_budget")
