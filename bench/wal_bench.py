"""P9: the Postgres WAL a create writes (`make bench ONLY=P9`).

On a private stack (bench/stack.py, the demo pack as P1 has it), BENCH_WARMUP_N creates
are made first and not counted (the first rows of each table and index, the budget's
row); then a CHECKPOINT, the WAL position, N creates (BENCH_P9_N, 3000) through the CRM
entry until every attempt is finalized (bench/create_bench.create_round, the product's
worker), the WAL position again: P9 = the difference over N. The server is the
durable one the stack runs (full_page_writes on), so the figure counts the full-page
images the first change to a page after the CHECKPOINT writes; `checkpoint_timeout`
is raised to an hour so no timed checkpoint falls inside the window and the count of
images is the same in every run (a checkpoint inside it fails the run).

The WAL is then read back with pg_walinspect and shared out by relation
(bench/wal_relations.py): every record's length goes to the relations its blocks
belong to, so the heap, the TOAST table and each index of a table can be told apart.

The figure is compared with the same measurement of 6e5fac5 (the schema before
migration 0340), made on the same machine by running this file in a checkout of that
commit with `--baseline`: it uses only helpers that commit already has with the same
signatures (bench_stack, create_round, record), so it runs there unchanged:

    git clone -q . /tmp/wal-base && git -C /tmp/wal-base checkout -q 6e5fac5
    cp bench/wal_bench.py bench/wal_relations.py /tmp/wal-base/bench/
    (cd /tmp/wal-base && make venv && .venv/bin/python -m bench.wal_bench --baseline \\
        --results "$PWD/bench/results/latest.json")  # run from this checkout's root
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import asyncpg

from bench.create_bench import QUEUE, create_round, log
from bench.ingress_bench import RESULTS, record
from bench.stack import BenchStack, bench_stack
from bench.wal_relations import Share, by_relation, by_table, report_lines
from worker.schedules import ensure_relay_schedule

WARMUP_N: Final = 100
N: Final = 3000
PREFIX: Final = "P9_"
TOP: Final = 25  # relations printed


def _commit() -> str:
    """The commit of the checkout this file runs in (a `+` when its tree has changes)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("+" if dirty else "")


async def _last_checkpoint(admin: asyncpg.Connection) -> str:
    """The control file's last checkpoint location. Not pg_stat_checkpointer's counts: the
    checkpointer publishes those after the CHECKPOINT command has returned, so on a loaded
    host the count read just after it could still lack it and the run failed for a
    checkpoint that fell before the window (the server's log showed none inside it)."""
    return str(await admin.fetchval("SELECT checkpoint_lsn FROM pg_control_checkpoint()"))


async def _prepare(admin: asyncpg.Connection) -> None:
    """pg_walinspect in the admin database (the reading is not counted: it writes no WAL),
    and no timed checkpoint inside the window."""
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    await admin.execute("ALTER SYSTEM SET checkpoint_timeout = '1h'")
    await admin.execute("ALTER SYSTEM SET max_wal_size = '8GB'")
    await admin.execute("SELECT pg_reload_conf()")


async def measure(stack: BenchStack, warmup_n: int, n: int) -> tuple[int, list[Share]]:
    """The WAL bytes N creates wrote after a CHECKPOINT, and their share by relation."""
    admin = await asyncpg.connect(stack.admin_dsn)
    try:
        await _prepare(admin)
        # As the worker has it: a wake-up the CRM entry deferred (its bounded wait ran out
        # on a loaded machine) is done by the relay's next sweep, not lost to the round.
        await ensure_relay_schedule(stack.client, QUEUE)
        log(f"P9 warm-up: {warmup_n} creates")
        await create_round(stack.client, stack, 0, warmup_n, count=False)
        await admin.execute("CHECKPOINT")
        checkpoint = await _last_checkpoint(admin)
        start = await admin.fetchval("SELECT pg_current_wal_lsn()")
        log(f"P9: {n} creates after a CHECKPOINT")
        await create_round(stack.client, stack, warmup_n, n, count=False)
        end = await admin.fetchval("SELECT pg_current_wal_lsn()")
        if await _last_checkpoint(admin) != checkpoint:
            raise SystemExit("P9: a checkpoint fell inside the window; the figure would not hold")
        total = int(await admin.fetchval("SELECT $2::pg_lsn - $1::pg_lsn", start, end))
        bench = await asyncpg.connect(stack.dsn)
        try:
            shares = await by_relation(admin, bench, start, end)
        finally:
            await bench.close()
    finally:
        await admin.close()
    return total, shares


def figures(total: int, shares: list[Share], n: int, suffix: str) -> dict[str, object]:
    """The latest.json keys: P9 itself, then (`suffix` aside) its N and commit and the
    bytes per create by table (heap, TOAST and indexes together) and by relation."""
    tables = by_table(shares)
    relations = {s.name: round(s.bytes / n) for s in shares if s.bytes / n >= 1}
    return {
        f"{PREFIX}wal_bytes_per_create{suffix}": round(total / n),
        f"{PREFIX}n{suffix}": n,
        f"{PREFIX}commit{suffix}": _commit(),
        f"{PREFIX}fpi_bytes_per_create{suffix}": round(sum(s.fpi for s in shares) / n),
        f"{PREFIX}by_table{suffix}": {k: round(v / n) for k, v in tables.items() if v / n >= 1},
        f"{PREFIX}by_relation{suffix}": relations,
    }


async def run_wal_bench(
    n: int = N, warmup_n: int = WARMUP_N, baseline: bool = False, results: Path = RESULTS
) -> Mapping[str, object]:
    """Measure P9, print its breakdown, merge it into `results`. `baseline` names the
    keys `..._baseline` (this file run in an older checkout, see the module's doc)."""
    if n < 1 or warmup_n < 1:
        raise SystemExit("bench: P9 needs at least one create and one warm-up create")
    async with bench_stack(warmup_n + n) as stack:
        total, shares = await measure(stack, warmup_n, n)
    for line in report_lines(shares, total, n, TOP):
        print(line)
    suffix = "_baseline" if baseline else ""
    result = figures(total, shares, n, suffix)
    commit = result[f"{PREFIX}commit{suffix}"]
    print(f"P9{suffix} = {total / n:,.0f} WAL bytes per create (N = {n}, {commit})")
    record(result, path=results)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=int(os.environ.get("BENCH_P9_N", N)))
    parser.add_argument(
        "--warmup-n", type=int, default=int(os.environ.get("BENCH_WARMUP_N", WARMUP_N))
    )
    parser.add_argument("--baseline", action="store_true", help="record as ..._baseline")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    asyncio.run(run_wal_bench(args.n, args.warmup_n, args.baseline, args.results))
