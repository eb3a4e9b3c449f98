"""bench-scale's link parts, over one database of N finalized links (P4's seed:
`bench.revalidation_bench.seed`, COPY with every trigger in force): the listing reads
(`status`, `links find`, a `links list --after` cursor page; issue 34 item 4) and bulk
revalidation through its CLI (`revalidate plan --all-finalized`, `validate`, `apply`;
item 1), with P4's bare set-based write floor (`bench.revalidation_bench.floor`) timed
in the same run after apply. P4 = (validate + apply links/s, as P4 defines it) ÷ floor.
"""

from __future__ import annotations

import json
from typing import Final

import asyncpg

from bench import revalidation_bench
from bench.revalidation_bench import log
from bench.scale.context import Context, Figures
from bench.scale.runner import Cli, CliRun, CommandFailed

PAGE: Final = 500  # the listings' default --limit


def _ms(run: CliRun) -> float:
    return round(run.seconds * 1000, 1)


async def listing(cli: Cli, n: int) -> Figures:
    """Wall time of each read as a user runs it: process start, connect, query, print."""
    start = await cli.run("cli-start", ["link-key", "--help"])
    status = await cli.run("status", ["status", "--json"])
    middle = f"p4-{n // 2:07d}"  # revalidation_bench's record ids
    find = await cli.run("find", ["links", "find", "--record-id", middle, "--json"])
    found = [json.loads(line) for line in find.stdout.read_text().splitlines()]
    limit = str(min(PAGE, n // 4))  # at a tiny n, still a page after the first
    first = await cli.run("page-first", ["links", "list", "--limit", limit, "--json"])
    news = json.loads(first.stderr.read_text().strip().splitlines()[-1])
    page = await cli.run(
        "page", ["links", "list", "--limit", limit, "--after", news["next_cursor"], "--json"]
    )
    rows = page.stdout.read_text().splitlines()
    assert len(found) == 1, found
    assert len(rows) == int(limit), len(rows)
    log(
        f"scale listing: status {_ms(status):.0f} ms, find {_ms(find):.0f} ms, cursor page "
        f"{_ms(page):.0f} ms (a CLI start alone {_ms(start):.0f} ms)"
    )
    return {
        "status_ms": _ms(status),
        "find_ms": _ms(find),
        "page_ms": _ms(page),
        "page_first_ms": _ms(first),
        "cli_start_ms": _ms(start),
    }


async def revalidation(cli: Cli, conn: asyncpg.Connection, n: int, install: str) -> Figures:
    manifest = cli.workdir / "manifest.json"
    plan_args = ["revalidate", "plan", "--operation-id", "scale-move", "--approved-by", "bench"]
    plan_args += ["--approval-reference", "scale", "--reason", "bulk mapping move"]
    plan_args += ["--new-pack-install", install, "--all-finalized", "--out", str(manifest)]
    plan = await cli.run("revalidate-plan", [*plan_args, "--json"])
    log(f"scale revalidate plan: {plan.seconds:.1f} s, {n / plan.seconds:,.0f} links/s")
    validate = await cli.run("revalidate-validate", ["revalidate", "validate", str(manifest)])
    log(f"scale revalidate validate: {validate.seconds:.1f} s, {n / validate.seconds:,.0f}/s")
    apply = await cli.run("revalidate-apply", ["revalidate", "apply", str(manifest)])
    log(f"scale revalidate apply: {apply.seconds:.1f} s, {n / apply.seconds:,.0f} links/s")
    receipts = await conn.fetchval("SELECT count(*) FROM connector_link_revalidation_receipt")
    assert receipts == n, f"{receipts} receipts for {n} links"
    floor = (await revalidation_bench.floor(conn, n))["P4_floor_per_s"]
    rate = n / (validate.seconds + apply.seconds)
    figures: Figures = {
        "P4": round(rate / floor, 3),
        "revalidate_per_s": round(rate),
        "revalidate_plan_per_s": round(n / plan.seconds),
        "revalidate_validate_per_s": round(n / validate.seconds),
        "revalidate_apply_per_s": round(n / apply.seconds),
        "floor_per_s": floor,
    }
    for run in (plan, validate, apply):
        if run.rss_mb is not None:
            figures[f"{run.name.replace('-', '_')}_rss_mb"] = run.rss_mb
    return figures


async def links(ctx: Context, n: int, parts: set[str]) -> Figures:
    """`listing` and/or `revalidation` on one database of n links. A revalidation command
    that fails (a lock table too small for the manifest, on a stock server) is a figure
    too: `revalidation_error` holds its exit and message, and the run goes on."""
    figures: Figures = {}
    async with ctx.database("links") as (dsn, conn):
        install = await revalidation_bench.seed(conn, n)
        cli = ctx.cli(dsn, "links")
        if "listing" in parts:
            figures |= await listing(cli, n)
        if "revalidation" in parts:
            try:
                figures |= await revalidation(cli, conn, n, install)
            except CommandFailed as failure:
                log(f"scale revalidation FAILED at {n:,} links: {failure}")
                figures["revalidation_error"] = str(failure)[:500]
    return figures
