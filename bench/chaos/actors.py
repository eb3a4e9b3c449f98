"""The campaign's users: the CRM (saves and record edits) and an operator who trusts the ledger.

Saves go through the `connector-push save` CLI (checked end to end) or the
in-process CRM API (cheaper, so the load stays high on a small machine).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass, field

import asyncpg
import httpx
from temporalio.client import Client

from bench.chaos.checker import SaveOutcome
from bench.chaos.evidence import Evidence, build_evidence, read_rows
from bench.chaos.stack import TASK_QUEUE, ChaosStack
from bench.chaos.world import Record, World
from protocol.admission import Rejected
from sandbox.client import SandboxClient
from services.record_loader import load_records, parse_records_document
from worker.crm import decision_link_key, report_save

CLI_TIMEOUT_S = 120.0
CLI_SHARE = 0.35  # of saves, when a CLI slot is free
CLI_SLOTS = 2  # CLI processes at once: each is a Python start on a 2-core machine
MAX_IN_FLIGHT = 24
SAVE_RATE = 10.0  # actions per second (Poisson)
MAX_SUPERSEDES = 3  # per link: a create that keeps failing stays parked for a person
OPERATOR = "chaos-operator"


async def run_cli(stack: ChaosStack, *args: str) -> tuple[int, str, str]:
    """`connector-push ARGS` as a subprocess: exit code, stdout, stderr (killed on timeout)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=stack.env,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        return -1, "", "timed out"
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@dataclass
class Traffic:
    """Concurrent saves, edits followed by repeated saves, and bursts on one record."""

    stack: ChaosStack
    world: World
    rng: random.Random
    pool: asyncpg.Pool
    client: Client
    saves: list[SaveOutcome] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    _cli: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CLI_SLOTS))

    async def run(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        while loop.time() < until:
            await asyncio.sleep(self.rng.expovariate(SAVE_RATE))
            if len(tasks) < MAX_IN_FLIGHT:
                task = asyncio.create_task(self._one(self.world.pick(self.rng)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)

    async def _one(self, record: Record) -> None:
        try:
            await self._act(record)
        except Exception as error:  # the campaign outlives any one action; the checker judges
            self.stats[f"action_error_{type(error).__name__}"] += 1

    async def _act(self, record: Record) -> None:
        draw = self.rng.random()
        if draw < 0.55:
            await self.save(record)
        elif draw < 0.85:
            await self.edit(record)
            for _ in range(self.rng.randint(1, 3)):
                await self.save(record)
        else:
            await asyncio.gather(*(self.save(record) for _ in range(self.rng.randint(2, 4))))

    async def edit(self, record: Record) -> None:
        document = parse_records_document(self.world.edit(record))
        try:
            async with self.pool.acquire() as conn:
                await load_records(conn, document)
            self.stats["edits"] += 1
        except Exception:  # Postgres restarting: the edit did not happen
            self.stats["edit_errors"] += 1

    async def save(self, record: Record, *, cli: bool | None = None) -> None:
        """One save; through the CLI when `cli`, or by a seeded draw when a slot is free."""
        if cli is None:
            cli = self.rng.random() < CLI_SHARE and not self._cli.locked()
        if cli:
            async with self._cli:
                outcome = await self._save_cli(record)
        else:
            outcome = await self._save_api(record)
        self.saves.append(outcome)
        self.stats[f"save_{outcome.via}_{outcome.kind}"] += 1
        if outcome.kind == "rejected":
            self.stats[f"rejected_{outcome.reason}"] += 1

    def refused(self) -> dict[str, str]:
        """Link key -> why its latest save was rejected (keys whose latest was accepted
        are absent)."""
        latest = {s.link_key: s for s in self.saves if s.kind != "error"}
        return {k: s.reason or "" for k, s in latest.items() if s.kind == "rejected"}

    async def _save_cli(self, record: Record) -> SaveOutcome:
        code, out, _err = await run_cli(self.stack, "save", *record.cli_args(), "--json")
        if code not in (0, 3):
            # By the CLI's documented exit code: its stderr names ports and paths that
            # differ per run, so keying by it split one failure into many counters.
            self.stats[f"cli_error_exit_{code}"] += 1
            return SaveOutcome(record.link_key, "cli", "error")
        decision = json.loads(out)
        return SaveOutcome(record.link_key, "cli", decision["kind"], decision.get("reason"))

    async def _save_api(self, record: Record) -> SaveOutcome:
        try:
            decision = await report_save(self.pool, self.client, TASK_QUEUE, record.save_request())
        except Exception:  # Postgres restarting: not accepted (the checker reads the rows)
            return SaveOutcome(record.link_key, "api", "error")
        key = decision_link_key(decision) or record.link_key
        reason = decision.reason.value if isinstance(decision, Rejected) else None
        return SaveOutcome(key, "api", decision.kind, reason)


_Action = tuple[tuple[str, str], list[str]]


@dataclass
class Operator:
    """Repairs parked creates as a careful person would, with the ledger as the truth:
    reconcile an ambiguous attempt with the object its own request created, and
    supersede a terminal_failed attempt. It also tries `supersede` once on every
    ambiguous attempt it finds, as a hasty person would: C-1 refuses it (the checker
    flags an accepted one as `supersede_after_effect`; `supersede_probe_accepted`
    counts them here)."""

    stack: ChaosStack
    stats: Counter[str] = field(default_factory=Counter)
    last_failures: list[str] = field(default_factory=list)
    _supersedes: Counter[str] = field(default_factory=Counter)
    _tried: set[tuple[str, str]] = field(default_factory=set)

    async def run(self, until: float, every_s: float = 5.0, per_pass: int = 4) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            try:
                await self.repair(per_pass)
            except Exception as error:  # e.g. Postgres restarting mid-read; next pass
                self.stats[f"pass_error_{type(error).__name__}"] += 1
            await asyncio.sleep(every_s)

    async def evidence(self) -> Evidence | None:
        """Ledger and rows now, or None while the sandbox or Postgres is down."""
        try:
            async with httpx.AsyncClient(timeout=10.0) as http:
                admin = SandboxClient(self.stack.sandbox.url, http)
                ledger = await admin.ledger()
            rows = await read_rows(self.stack.dsn)
        except (httpx.HTTPError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return None  # the sandbox or Postgres is restarting
        return build_evidence(ledger, rows, {})

    async def repair(self, limit: int) -> int:
        ev = await self.evidence()
        if ev is None:
            return 0
        latest = [rows[-1] for rows in ev.attempts_by_key().values()]
        actions = [a for a in (self._action(ev, row) for row in latest) if a is not None]
        for marker, args in actions[:limit]:
            await self._run(marker, args)
        for marker, _ in actions[limit:]:
            self._tried.discard(marker)  # next pass
        return len(actions)

    def _action(self, ev: Evidence, attempt: dict[str, object]) -> _Action | None:
        key, status = str(attempt["link_key"]), attempt["status"]
        marker = (str(attempt["attempt_id"]), str(status))
        if marker in self._tried:
            return None
        if status == "ambiguous_remote_effect":
            probe = (str(attempt["attempt_id"]), "supersede_probe")
            if probe not in self._tried:
                self._tried.add(probe)
                return probe, ["supersede", key]
            created = {e.object_id for e in ev.creates_of.get(str(attempt["attempt_id"]), [])}
            if len(created) != 1:
                return None  # nothing landed (stays parked) or already a duplicate
            (remote_id,) = created
            self._tried.add(marker)
            evidence = f"sandbox ledger: create of {remote_id} by this attempt's request"
            args = ["reconcile", key, "--remote-id", str(remote_id), "--evidence", evidence]
            return marker, args
        if status == "terminal_failed" and self._supersedes[key] < MAX_SUPERSEDES:
            self._tried.add(marker)
            return marker, ["supersede", key]
        return None

    async def _run(self, marker: tuple[str, str], args: list[str]) -> None:
        who = ["--operator", OPERATOR, "--reason", "chaos campaign repair", "--json"]
        code, _, err = await run_cli(self.stack, *args, *who)
        if marker[1] == "supersede_probe":
            # Expected refused (C-1); never retried, whatever the CLI said.
            self.stats["supersede_probe_" + ("accepted" if code == 0 else "refused")] += 1
            if code == 0:
                self.last_failures.append(f"supersede accepted on ambiguous {args[1]}")
            return
        outcome = "ok" if code == 0 else "refused" if "refused" in err else "error"
        self.stats[f"{args[0]}_{outcome}"] += 1
        if outcome != "ok":
            self.last_failures.append(f"{' '.join(args[:2])}: {err.strip()[-300:]}")
        if args[0] == "supersede" and outcome == "ok":
            self._supersedes[args[1]] += 1
        if outcome == "error":
            # Not refused: the CLI failed (e.g. Temporal restarting); try again next pass.
            self._tried.discard(marker)
