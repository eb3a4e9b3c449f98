"""bench-scale's link parts, over one database of N finalized links (P4's seed:
`bench.revalidation_bench.seed`, COPY with every trigger in force): the listing reads
(`status`, `links find`, a `links list --after` cursor page; issue 34 item 4) and bulk
revalidation through its CLI (`revalidate plan --all-finalized`, `validate`, `apply`;
item 1), with P4's bare set-based write floor (`bench.revalidation_bench.floor`) timed
in the same run after apply. P4 = (validate + apply links/s, as P4 defines it) ÷ floor.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from typing import Final

import asyncpg

from bench import revalidation_bench
from bench.revalidation_bench import log
from bench.scale.context import Context, Figures
from bench.scale.runner import Cli, CliRun, CommandFailed
from cli import paging
from db import link_search, pages
from services.status import read_status

PAGE: Final = 500  # the listings' default --limit


def _ms(run: CliRun) -> float:
    return round(run.seconds * 1000, 1)


async def _query_ms(work: Awaitable[object]) -> float:
    started = time.monotonic()
    await work
    return round((time.monotonic() - started) * 1000, 1)


async def _drain(rows: AsyncIterator[object]) -> int:
    return len([row async for row in rows])


async def queries(conn: asyncpg.Connection, record_id: str, cursor: str, limit: int) -> Figures:
    """The same three reads in this process, through the functions the commands call:
    the query's share of each command's wall time (a CLI start here is seconds when the
    machine is loaded)."""
    after = paging.time_key_cursor(cursor, "links")
    return {
        "status_query_ms": await _query_ms(read_status(conn, datetime.now(UTC))),
        "find_query_ms": await _query_ms(link_search.links_by_record_id(conn, record_id, "", PAGE)),
        "page_query_ms": await _query_ms(_drain(pages.links_page(conn, None, after, limit))),
    }


async def listing(cli: Cli, conn: asyncpg.Connection, n: int) -> Figures:
    """Wall time of each read as a user runs it (process start, connect, query, print),
    and the query's own time in this process."""
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
        **await queries(conn, middle, news["next_cursor"], int(limit)),
        "status_ms": _ms(status),
        "find_ms": _ms(find),
        "page_ms": _ms(page),
        "page_first_ms": _ms(first),
        "cli_start_ms": _ms(start),
    }


async def revalidation(cli: Cli, conn: asyncpg.Connection, n: int, install: str) -> Figures:
    """plan, validate, apply; P4's floor is timed after them whether they all ran or not
    (a command that fails is a figure too: `revalidation_error`, its exit and message)."""
    manifest = str(cli.workdir / "manifest.json")
    plan = ["plan", "--operation-id", "scale-move", "--approved-by", "bench"]
    plan += ["--approval-reference", "scale", "--reason", "bulk mapping move"]
    plan += ["--new-pack-install", install, "--all-finalized", "--out", manifest, "--json"]
    phases = {"plan": plan, "validate": ["validate", manifest], "apply": ["apply", manifest]}
    figures: Figures = {}
    seconds: dict[str, float] = {}
    try:
        for phase, args in phases.items():
            run = await cli.run(f"revalidate_{phase}", ["revalidate", *args])
            seconds[phase] = run.seconds
            figures[f"revalidate_{phase}_per_s"] = round(n / run.seconds)
            if run.rss_mb is not None:
                figures[f"revalidate_{phase}_rss_mb"] = run.rss_mb
            log(f"scale revalidate {phase}: {run.seconds:.1f} s, {n / run.seconds:,.0f} links/s")
    except CommandFailed as failure:
        log(f"scale revalidation FAILED at {n:,} links: {failure}")
        figures["revalidation_error"] = str(failure)[:500]
    floor = (await revalidation_bench.floor(conn, n))["P4_floor_per_s"]
    figures["floor_per_s"] = floor
    if len(seconds) == len(phases):
        receipts = await conn.fetchval("SELECT count(*) FROM connector_link_revalidation_receipt")
        assert receipts == n, f"{receipts} receipts for {n} links"
        rate = n / (seconds["validate"] + seconds["apply"])
        figures |= {"P4": round(rate / floor, 3), "revalidate_per_s": round(rate)}
    return figures


async def links(ctx: Context, n: int, parts: set[str]) -> Figures:
    """`listing` and/or `revalidation` on one database of n links."""
    figures: Figures = {}
    async with ctx.database("links") as (dsn, conn):
        install = await revalidation_bench.seed(conn, n)
        cli = ctx.cli(dsn, "links")
        if "listing" in parts:
            figures |= await listing(cli, conn, n)
        if "revalidation" in parts:
            figures |= await revalidation(cli, conn, n, install)
    return figures
