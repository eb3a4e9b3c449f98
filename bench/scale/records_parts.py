"""bench-scale's record parts: `push --all` (initial sync, issue 34 item 2) and
`backfill plan|apply` (item 3), each interrupted part-way with SIGINT and run again.

The interruption is placed, not timed: the harness holds the link-key lock of the
middle record (the product's own `db.links.lock_link_key`) in an open transaction, so
the command commits every page before that record's and then waits on the lock; once
Postgres shows it waiting, the command gets SIGINT, and the lock is released. The rerun
must then finish the rest, and every record must end admitted (or adopted) exactly once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import asyncpg

from bench.revalidation_bench import ACTION, OWNER, log
from bench.scale import rows
from bench.scale.context import Context, Figures
from bench.scale.runner import Cli, CliRun, lock_waiter
from db import links as links_q

# Exit codes of a command stopped by SIGINT: push says 130; backfill leaves it to click
# ("Aborted!", 1).
INTERRUPTED: Final = (1, 130)
PUSH_PAGE: Final = 200  # push's default --page-size
APPLY_PAGE: Final = 500  # backfill apply's default --batch-size


def page_size(n: int, default: int) -> int:
    """The product's default page, or at a tiny n one small enough that the middle record's
    page is not the first (so the interruption lands part-way)."""
    return default if n >= 20 * default else max(1, n // 20)


@asynccontextmanager
async def middle_key_held(dsn: str, n: int) -> AsyncIterator[None]:
    """The middle record's link-key lock, held by the harness until the block ends."""
    holder = await asyncpg.connect(dsn)
    try:
        async with holder.transaction():
            await links_q.lock_link_key(holder, rows.key_of(n // 2))
            yield
    finally:
        await holder.close()


async def interrupted_then_resumed(
    cli: Cli, dsn: str, n: int, name: str, args: list[str]
) -> tuple[CliRun, CliRun]:
    timeout = 300.0 + n / 50  # the pages before the middle one, at a crawling 100/s
    async with middle_key_held(dsn, n):
        first = await cli.run(
            f"{name}-interrupted",
            args,
            expect=INTERRUPTED,
            interrupt_when=lambda: lock_waiter(dsn, timeout),
        )
    assert first.interrupted_after_s is not None, f"{name} ended before it could be interrupted"
    log(f"scale {name}: SIGINT after {first.interrupted_after_s:.1f} s, exit {first.exit_code}")
    second = await cli.run(f"{name}-resumed", args)
    log(f"scale {name}: resumed run {second.seconds:.1f} s")
    return first, second


async def counts(conn: asyncpg.Connection, table: str) -> tuple[int, int]:
    """Rows of `table`, and distinct link keys among them."""
    row = await conn.fetchrow(f"SELECT count(*), count(DISTINCT link_key) FROM {table}")
    assert row is not None
    return int(row[0]), int(row[1])


def _rss(*runs: CliRun) -> float | None:
    known = [r.rss_mb for r in runs if r.rss_mb is not None]
    return max(known) if known else None


def _with_rss(figures: Figures, key: str, *runs: CliRun) -> Figures:
    rss = _rss(*runs)
    return figures if rss is None else {**figures, key: rss}


async def push(ctx: Context, n: int) -> Figures:
    async with ctx.database("push") as (dsn, conn):
        await rows.contacts(conn, n, legacy=False)
        args = ["push", "--owner-key", OWNER, "--action-slot", ACTION, "--user", rows.USER]
        args += ["--all", "--no-wait", "--json", "--page-size", str(page_size(n, PUSH_PAGE))]
        args += ["--ahead", "0"]  # admission throughput: no worker drains the budget here
        first, second = await interrupted_then_resumed(ctx.cli(dsn, "push"), dsn, n, "push", args)
        summary = json.loads(second.stdout.read_text())  # one indented document
        total, keys = await counts(conn, "connector_push_attempt")
    assert first.interrupted_after_s is not None
    assert total == keys == n, f"push: {total} attempts over {keys} keys for {n} records"
    assert summary["skipped_active_attempt"] > 0, summary  # the resumed run skipped the first's
    seconds = first.interrupted_after_s + second.seconds
    log(f"scale push: {n:,} admitted once each, {n / seconds:,.0f}/s over both runs")
    figures: Figures = {
        "push_per_s": round(n / seconds),
        "push_s": round(seconds, 2),
        "push_resumed_s": round(second.seconds, 2),
    }
    return _with_rss(figures, "push_rss_mb", first, second)


async def backfill(ctx: Context, n: int) -> Figures:
    async with ctx.database("backfill") as (dsn, conn):
        await rows.contacts(conn, n, legacy=True)
        cli = ctx.cli(dsn, "backfill")
        plan = await cli.run("backfill-plan", ["backfill", "plan", "--owner-key", OWNER, "--json"])
        planned = json.loads(plan.last_stdout_line())["totals"]
        log(f"scale backfill plan: {plan.seconds:.1f} s, {n / plan.seconds:,.0f} rows/s")
        apply = ["backfill", "apply", "--owner-key", OWNER, "--json"]
        apply += ["--batch-size", str(page_size(n, APPLY_PAGE))]
        first, second = await interrupted_then_resumed(cli, dsn, n, "backfill-apply", apply)
        applied = json.loads(second.last_stdout_line())["totals"]
        total, keys = await counts(conn, "connector_remote_link")
    assert planned["adoptable"] == n, planned
    assert total == keys == n, f"backfill: {total} links over {keys} keys for {n} records"
    assert applied["adopted"] + applied["already_adopted"] == n, applied
    assert 0 < applied["already_adopted"] < n, applied  # the first run's pages stood
    assert first.interrupted_after_s is not None
    seconds = first.interrupted_after_s + second.seconds
    log(f"scale backfill apply: {n:,} adopted once each, {n / seconds:,.0f} rows/s")
    figures: Figures = {
        "backfill_plan_per_s": round(n / plan.seconds),
        "backfill_apply_per_s": round(n / seconds),
        "backfill_plan_s": round(plan.seconds, 2),
        "backfill_apply_s": round(seconds, 2),
    }
    figures = _with_rss(figures, "backfill_plan_rss_mb", plan)
    return _with_rss(figures, "backfill_apply_rss_mb", first, second)
