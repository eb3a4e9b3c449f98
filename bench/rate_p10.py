"""Benchmark P10 (issue 33 item 2, SPEC NF-8): a small tenant's single save while a big
tenant pushes.

Two owners, two credentials (two remote budgets, each declaring LIMIT per 10 s): the big
tenant (`demo-owner`) runs `connector-push push --all` over N contacts in its own
process; two `connector-push worker` processes send. The small tenant (`small-owner`)
saves one company at a time (`worker.crm.report_save`, as the CRM entry does); its
latency is from the call to the create's arrival in the sandbox's ledger (one clock).

P10 = the median small-tenant latency during the big push over the median on the idle
system (target <= 2). The saves are single saves, not a stream: each starts
`SPACING_INTERVALS` of its budget's request interval after the one before, so the small
tenant's own budget (it declares the same limit) never paces them. Sent back to back,
the idle saves read 55-80 ms against 45 ms spaced on one stack, which hid most of the
ratio (about 2.0 read where spaced saves read 2.8).

The push is stopped once the loaded saves are measured: a push of 20,000 at 10/s takes
half an hour, the small tenant's saves need its first minute.

    python -m bench.rate_p10 [--n 20000] [--limit 100] [--saves 12]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Final

import asyncpg
import httpx

from bench.ingress_bench import ROOT, record
from bench.rate_bench import (
    OWNER,
    TASK_QUEUE,
    Setup,
    _env,
    limited_manifest,
    wait_for_pollers,
    worker_processes,
)
from bench.stack import BenchStack, bench_stack
from protocol.admission import SaveRequest
from sandbox.client import SandboxClient
from sandbox.config import RateLimitConfig
from sandbox.rate_limit import RateLimitSettings
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from worker.crm import report_save

SMALL_OWNER: Final = "small-owner"
SMALL_CREDENTIAL: Final = "env:SANDBOX_TOKEN_SMALL"
WINDOW_S: Final = 10.0
WARM_WINDOWS: Final = 2  # the big push's creates before the loaded saves begin
SAVE_TIMEOUT_S: Final = 60.0
SAVES: Final = 12  # per phase (5 before the spacing): the median of more single saves
SPACING_INTERVALS: Final = 3  # between single saves, in the budget's request interval


def spacing_s(limit_requests: int) -> float:
    """Seconds between the small tenant's single saves at this limit per WINDOW_S."""
    return SPACING_INTERVALS * WINDOW_S / limit_requests


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _small_manifest(stack: BenchStack, setup: Setup) -> dict[str, object]:
    manifest = limited_manifest(stack.sandbox_url, setup)
    manifest["connectorOwnerKey"] = SMALL_OWNER
    for profile in manifest["profiles"]:  # type: ignore[attr-defined]
        profile["credentialRef"] = SMALL_CREDENTIAL  # its own budget
    return manifest


def _accounts(count: int) -> dict[str, object]:
    records = [
        {"object": "Account", "id": f"small-a-{i:03d}", "fields": {"Name": f"Small {i}"}}
        for i in range(count)
    ]
    fields = ["Name", "Website", "PrimaryContactId", "remote_id__c", "remote_provenance__c"]
    return {
        "records": records,
        "grants": [{"user": "bench", "object": "Account", "records": "*", "fields": fields}],
    }


async def prepare(stack: BenchStack, sandbox: SandboxClient, setup: Setup, saves: int) -> None:
    conn = await asyncpg.connect(stack.dsn)
    try:
        await apply_pack(conn, limited_manifest(stack.sandbox_url, setup))
        await apply_pack(conn, _small_manifest(stack, setup))
        await load_records(conn, parse_records_document(_accounts(2 * saves)))
    finally:
        await conn.close()
    await sandbox.reset()
    # Each tenant's own budget is the declared limit; the sandbox counts per object type.
    bucket = RateLimitConfig(requests=setup.requests, per_seconds=setup.window)
    await sandbox.set_rate_limit(RateLimitSettings(rate_limit=bucket))


def _at(entry_at: str) -> float:
    return datetime.fromisoformat(entry_at.replace("Z", "+00:00")).timestamp()


async def save_latency(
    pool: asyncpg.Pool, stack: BenchStack, sandbox: SandboxClient, record_id: str
) -> float:
    """Seconds from the small tenant's save to its create at the remote (SAVE_TIMEOUT_S
    when it has not arrived by then: a figure, not an error)."""
    save = SaveRequest(
        connector_owner_key=SMALL_OWNER,
        action_slot_id="push-company",
        destination_slot_id="remote-companies",
        source_object="Account",
        source_record_id=record_id,
        originating_user_id="bench",
    )
    before = len(await sandbox.ledger("companies", "create"))
    started = time.time()
    await report_save(pool, stack.client, TASK_QUEUE, save)
    while time.time() - started < SAVE_TIMEOUT_S:
        creates = await sandbox.ledger("companies", "create")
        if len(creates) > before:
            return _at(creates[before].at) - started
        await asyncio.sleep(0.05)  # poll interval; the ledger's time is the figure
    return SAVE_TIMEOUT_S


async def single_saves(
    pool: asyncpg.Pool,
    stack: BenchStack,
    sandbox: SandboxClient,
    record_ids: list[str],
    spacing: float,
) -> list[float]:
    """One latency per record, each save starting `spacing` seconds after the one before."""
    latencies: list[float] = []
    for record_id in record_ids:
        started = time.monotonic()
        latencies.append(await save_latency(pool, stack, sandbox, record_id))
        await asyncio.sleep(max(0.0, spacing - (time.monotonic() - started)))  # pacing
    return latencies


async def _wait_for_big_creates(sandbox: SandboxClient, count: int) -> None:
    async with asyncio.timeout(600):
        while len(await sandbox.ledger("contacts", "create")) < count:
            await asyncio.sleep(0.5)  # poll interval; the ledger is the condition


def _start_push(stack: BenchStack, log_path: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "cli", "push", "--owner-key", OWNER]
    command += ["--action-slot", "push-contact", "--user", "bench", "--all", "--json"]
    with log_path.open("wb") as out:
        return subprocess.Popen(
            command, env=_env(stack), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


async def measure(n: int, limit_requests: int, saves: int) -> dict[str, float]:
    setup = Setup(n, limit_requests / WINDOW_S, WINDOW_S, 2, 16)
    async with bench_stack(n) as stack, httpx.AsyncClient(timeout=30.0) as http:
        sandbox = SandboxClient(stack.sandbox_url, http)
        await prepare(stack, sandbox, setup, saves)
        log_dir = Path(tempfile.mkdtemp(prefix="cp-bench-p10-"))
        pool = await asyncpg.create_pool(stack.dsn, min_size=1, max_size=4)
        try:
            with worker_processes(stack, 2, log_dir):
                await wait_for_pollers(stack.client, 2)
                ids = [f"small-a-{i:03d}" for i in range(2 * saves)]
                spacing = spacing_s(limit_requests)
                idle = await single_saves(pool, stack, sandbox, ids[:saves], spacing)
                log(f"P10: idle latencies {[round(x, 2) for x in idle]}; pushing {n} contacts")
                push = _start_push(stack, log_dir / "push.log")
                try:
                    await _wait_for_big_creates(sandbox, WARM_WINDOWS * limit_requests)
                    loaded = await single_saves(pool, stack, sandbox, ids[saves:], spacing)
                    big = len(await sandbox.ledger("contacts", "create"))
                finally:
                    push.send_signal(signal.SIGINT)
                    try:
                        push.wait(60)
                    except subprocess.TimeoutExpired:
                        push.kill()
                        push.wait(10)
        finally:
            await pool.close()
    idle_s, loaded_s = statistics.median(idle), statistics.median(loaded)
    log(f"P10: loaded latencies {[round(x, 2) for x in loaded]} ({big} big-tenant creates)")
    return {
        "P10": round(loaded_s / idle_s, 2),
        "P10_idle_s": round(idle_s, 3),
        "P10_loaded_s": round(loaded_s, 3),
        "P10_loaded_worst_s": round(max(loaded), 3),
        "P10_big_n": n,
        "P10_saves": saves,
        "P10_spacing_s": round(spacing, 3),
        "P10_limit_per_10s": limit_requests,
        "P10_load_1m": round(os.getloadavg()[0], 2),
    }


async def run_p10_bench(
    n: int = 20_000, limit_requests: int = 100, saves: int = SAVES, write: bool = True
) -> dict[str, float]:
    figures = await measure(n, limit_requests, saves)
    print(
        f"P10 big push N={n} at {limit_requests}/10 s: small tenant's save "
        f"{figures['P10_loaded_s']} s under load vs {figures['P10_idle_s']} s idle = "
        f"{figures['P10']}x (target <= 2; worst {figures['P10_loaded_worst_s']} s); "
        f"load {figures['P10_load_1m']} on {os.cpu_count()} cores"
    )
    if write:
        record(figures, replaces=("P10",))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=int(os.environ.get("BENCH_P10_N", "20000")))
    parser.add_argument("--limit", type=int, default=100, help="requests per 10 s")
    parser.add_argument("--saves", type=int, default=SAVES)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    asyncio.run(run_p10_bench(args.n, args.limit, args.saves, not args.no_write))


if __name__ == "__main__":
    main()
