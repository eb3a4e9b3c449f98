"""One campaign: start the stack, run traffic, operator and faults for `seconds`, settle, check."""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from temporalio.client import Client

from bench.chaos.actors import Operator, Traffic
from bench.chaos.checker import Final, Verdict, check, classify, listed_parked, settled
from bench.chaos.config import ChaosConfig
from bench.chaos.evidence import Evidence, build_evidence, read_rows
from bench.chaos.faults import FaultTally, ProcessFaults, SandboxFaults
from bench.chaos.gate_check import read_history, side_checks
from bench.chaos.sampler import Sampler
from bench.chaos.side_paths import SIDE_PATHS, SidePaths
from bench.chaos.stack import ChaosStack, chaos_stack
from bench.chaos.world import World
from db.pool import create_pool
from sandbox.client import SandboxClient
from services.record_loader import load_records, parse_records_document

log = logging.getLogger("bench.chaos")
LONG_OUTAGE_EVERY_S = 400.0  # one outage beyond the retry budget per this much campaign time
STABLE_POLLS = 6  # polls (3 s apart) with nothing in flight and nothing changing: quiescent


@dataclass
class Outcome:
    """What `python -m bench.chaos` prints and writes."""

    seed: int
    seconds: float
    family: str
    faults: dict[str, int]
    violations: list[dict[str, object]]
    settled: bool = False
    end_states: dict[str, int] = field(default_factory=dict)
    traffic: dict[str, int] = field(default_factory=dict)
    operator: dict[str, int] = field(default_factory=dict)
    operator_failures: list[str] = field(default_factory=list)
    side_paths: dict[str, int] = field(default_factory=dict)
    side_path_answers: dict[str, int] = field(default_factory=dict)
    side_paths_not_applicable: dict[str, str] = field(default_factory=dict)
    logs: str | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "seconds": self.seconds,
            "family": self.family,
            "faults": self.faults,
            "faults_total": sum(self.faults.values()),
            "violations": self.violations,
            "settled": self.settled,
            "end_states": self.end_states,
            "traffic": self.traffic,
            "operator": self.operator,
            "operator_failures": self.operator_failures,
            "side_paths": self.side_paths,
            "side_path_answers": self.side_path_answers,
            "side_paths_not_applicable": self.side_paths_not_applicable,
            "logs": self.logs,
        }


async def snapshot(stack: ChaosStack) -> Evidence:
    """The ledger, the sandbox's objects and every relevant row, read now."""
    async with httpx.AsyncClient(timeout=30.0) as http:
        admin = SandboxClient(stack.sandbox.url, http)
        ledger = await admin.ledger()
        family = stack.family
        objects = {
            t: {str(o[family.listing_id]) for o in await admin.objects(t)}
            for t in family.object_types
        }
    return build_evidence(ledger, await read_rows(stack.dsn), objects)


@dataclass
class Observers:
    """The side-path actors and the evidence sampler, made with the chaos phase."""

    sampler: Sampler
    side: SidePaths | None = None

    def side_paths(self, tally: FaultTally, not_applicable: dict[str, str]) -> dict[str, int]:
        counts = dict(self.side.counts) if self.side else {}
        counts["slow_answer"] = tally.counts["drip_after_effect"]
        return {path: counts.get(path, 0) for path in SIDE_PATHS if path not in not_applicable}


async def _chaos_phase(
    cfg: ChaosConfig,
    stack: ChaosStack,
    actors: tuple[Traffic, Operator, Observers],
    tally: FaultTally,
) -> None:
    traffic, operator, observers = actors
    sandbox_faults = SandboxFaults(stack, random.Random(f"{cfg.seed}:sandbox"), tally)
    side = SidePaths(traffic, sandbox_faults, random.Random(f"{cfg.seed}:side"))
    observers.side = side
    process = ProcessFaults(stack, random.Random(f"{cfg.seed}:process"), tally, sandbox_faults)
    loop = asyncio.get_running_loop()
    start = loop.time()
    until = start + cfg.seconds
    n_long = int(cfg.seconds // LONG_OUTAGE_EVERY_S)
    long_outages = [start + cfg.seconds * (i + 1) / (n_long + 1) for i in range(n_long)]
    # The sampler looks until every actor is done: an episode begun before `until` (a slot
    # removal and the revalidation under it) may end after it.
    sampling = asyncio.create_task(observers.sampler.run())
    try:
        await asyncio.gather(
            traffic.run(until),
            sandbox_faults.run(until),
            process.kill_workers(until),
            process.restarts(until, long_outages),
            process.revive_workers(until),
            operator.run(until),
            side.run(until) if cfg.side_paths else asyncio.sleep(0),
        )
        await sandbox_faults.off()
    finally:
        observers.sampler.stop()
        await sampling
        await sandbox_faults.close()


async def _all_up(stack: ChaosStack) -> None:
    if not stack.sandbox.up:
        await asyncio.to_thread(stack.sandbox.start)
    for slot in sorted(stack.workers.down):
        stack.workers.start(slot)
    stack.workers.revive()


async def _push_awaited_targets(
    world: World, traffic: Traffic, verdicts: dict[str, Verdict], pushed: set[str]
) -> int:
    """A company whose primary contact was never saved waits for it by design (LANE-2):
    the CRM saves that contact, as it eventually would. How many targets were saved for
    the first time (each is added to `pushed`)."""
    first = 0
    for key, verdict in verdicts.items():
        target = world.dependency(key)
        if verdict.state is Final.UNSETTLED and target is not None and target not in verdicts:
            await traffic.save(world.record(target), cli=False)
            first += target not in pushed
            pushed.add(target)
    return first


async def _settle(
    cfg: ChaosConfig,
    stack: ChaosStack,
    world: World,
    client: Client,
    actors: tuple[Traffic, Operator],
) -> tuple[Evidence, dict[str, Verdict], set[str], bool]:
    """Faults off, everything up: repair and wait until nothing is in flight and every
    parked link is listed, or nothing has changed for `STABLE_POLLS` polls."""
    traffic, operator = actors
    await _all_up(stack)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.settle_seconds
    previous, unchanged = None, 0
    targets: set[str] = set()
    while True:
        stack.workers.revive()
        pending_repairs = await operator.repair(limit=8)
        ev = await snapshot(stack)
        listed = await listed_parked(client)
        verdicts = classify(ev, world.dependency, traffic.refused())
        pushed = await _push_awaited_targets(world, traffic, verdicts, targets)
        quiet = pending_repairs == 0 and not any(
            v.state is Final.UNSETTLED for v in verdicts.values()
        )
        unchanged = unchanged + 1 if quiet and (verdicts, listed) == previous else 0
        previous = (verdicts, listed)
        done = quiet and (settled(verdicts, listed) or unchanged >= STABLE_POLLS)
        # A target pushed now is not in this snapshot: poll once more, past the deadline too
        # (each target is pushed once, so this ends).
        if done or (loop.time() > deadline and not pushed):
            return ev, verdicts, listed, done
        await asyncio.sleep(3)


async def run_campaign(cfg: ChaosConfig) -> Outcome:
    if cfg.workdir is not None:  # CHAOS_WORKDIR names where to work, made if missing
        cfg.workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="cp-chaos-", dir=cfg.workdir))
    tally = FaultTally()
    async with chaos_stack(root, cfg.workers, cfg.family) as stack:
        world = World(cfg.seed, cfg.record_pool, cfg.family)
        document = parse_records_document(world.initial_document())
        # min_size 0: no background reconnects (and their tracebacks) while Postgres restarts.
        pool = await create_pool(stack.dsn, min_size=0, max_size=12)
        try:
            async with pool.acquire() as conn:
                await load_records(conn, document)
            client = await stack.connect()
            traffic = Traffic(stack, world, random.Random(f"{cfg.seed}:traffic"), pool, client)
            operator = Operator(stack)
            observers = Observers(Sampler(stack.dsn))
            log.info("stack up in %s; injecting faults for %.0f s", root, cfg.seconds)
            await _chaos_phase(cfg, stack, (traffic, operator, observers), tally)
            log.info("faults off; settling (at most %.0f s)", cfg.settle_seconds)
            actors = (traffic, operator)
            ev, verdicts, listed, done = await _settle(cfg, stack, world, client, actors)
            await observers.sampler.sample()  # the settled state, against the last sample
            history = await read_history(stack.dsn)
        finally:
            await pool.close()
        parked = [k for k, v in verdicts.items() if v.state is Final.PARKED]
        violations = [
            *check(ev, verdicts, listed, traffic.saves),
            *side_checks(ev, history, parked),
            *observers.sampler.found(),
        ]
    outcome = Outcome(
        seed=cfg.seed,
        seconds=cfg.seconds,
        family=cfg.family.name,
        faults=tally.as_dict(),
        violations=violations,
        settled=done,
        end_states=dict(Counter(v.state.value for v in verdicts.values())),
        traffic=dict(sorted(traffic.stats.items())),
        operator=dict(sorted(operator.stats.items())),
        operator_failures=operator.last_failures[-20:],
        side_paths=observers.side_paths(tally, cfg.family.not_applicable),
        side_path_answers=dict(sorted(observers.side.answers.items())) if observers.side else {},
        side_paths_not_applicable=cfg.family.not_applicable,
    )
    if violations:
        outcome.logs = str(root)  # kept for the post-mortem
    else:
        shutil.rmtree(root, ignore_errors=True)
    return outcome
