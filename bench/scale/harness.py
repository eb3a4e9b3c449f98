"""Run bench-scale's parts at each N on one server, and report: flat keys, each figure
suffixed with its N (`push_per_s_100000`, `P4_1000000`, `wall_s_1000000`, and how busy
the machine was: `load_1m_start_<N>`, `load_1m_end_<N>`), plus the server's settings
(`pg_max_locks_per_transaction`, `pg_max_connections`, `pg_shared_buffers`) and
`rss_method`. Rates are per second (`_per_s`), times in `_s` or `_ms`, peak RSS in
`_rss_mb`; a part that failed leaves `<part>_error_<N>`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Final

import asyncpg

from bench.revalidation_bench import log
from bench.scale import links_parts, records_parts
from bench.scale.context import Context, Figures
from bench.scale.runner import CommandFailed

PARTS: Final = ("listing", "revalidation", "push", "backfill")  # in run order
SETTINGS: Final = ("max_locks_per_transaction", "max_connections", "shared_buffers")
RESULTS: Final = Path(__file__).resolve().parents[1] / "results" / "scale-latest.json"
RSS_METHOD: Final = "ru_maxrss of each command's own process, from os.wait4"


def selected(only: str | None) -> list[str]:
    """The parts named (comma-separated), in run order; an unknown name is an error."""
    if not only:
        return list(PARTS)
    names = {name.strip().lower() for name in only.split(",") if name.strip()}
    unknown = sorted(names - set(PARTS))
    if unknown:
        raise SystemExit(f"bench-scale: unknown part(s) {', '.join(unknown)}; known: {PARTS}")
    return [name for name in PARTS if name in names]


async def server_settings(admin_dsn: str) -> Figures:
    conn = await asyncpg.connect(admin_dsn)
    try:
        return {f"pg_{name}": str(await conn.fetchval(f"SHOW {name}")) for name in SETTINGS}
    finally:
        await conn.close()


async def _part(name: str, work: Awaitable[Figures], strict: bool) -> Figures:
    """A part's figures; a part whose command failed or whose check did not hold is a
    figure too (`<part>_error`: the exit and message, or the assertion), and the run goes
    on with the next part. With `strict` (the test) it raises."""
    try:
        return await work
    except (CommandFailed, AssertionError) as failure:
        if strict:
            raise
        log(f"bench-scale: {name} FAILED: {failure!r}")
        return {f"{name}_error": repr(failure)[:500]}


async def run_scale(
    ctx: Context, ns: Sequence[int], parts: Sequence[str], *, strict: bool = False
) -> Figures:
    began = time.monotonic()
    results: Figures = await server_settings(ctx.admin_dsn)
    results["rss_method"] = RSS_METHOD
    log(f"bench-scale: {', '.join(parts)} at N = {', '.join(f'{n:,}' for n in ns)}; {results}")
    for n in ns:
        started = time.monotonic()
        figures: Figures = {"load_1m_start": round(os.getloadavg()[0], 2)}
        if {"listing", "revalidation"} & set(parts):
            figures |= await _part("links", links_parts.links(ctx, n, set(parts)), strict)
        if "push" in parts:
            figures |= await _part("push", records_parts.push(ctx, n), strict)
        if "backfill" in parts:
            figures |= await _part("backfill", records_parts.backfill(ctx, n), strict)
        figures["load_1m_end"] = round(os.getloadavg()[0], 2)
        figures["wall_s"] = round(time.monotonic() - started, 1)
        log(f"bench-scale: N = {n:,} done in {figures['wall_s']} s")
        results |= {f"{key}_{n}": value for key, value in figures.items()}
    log(f"bench-scale: {time.monotonic() - began:.0f} s in all")
    return results


def table(results: Figures, ns: Sequence[int]) -> str:
    """One row per figure, one column per N."""
    names: list[str] = []
    for key in results:
        for n in ns:
            suffix = f"_{n}"
            if key.endswith(suffix) and key[: -len(suffix)] not in names:
                names.append(key[: -len(suffix)])
    width = max([len(name) for name in names] + [6])
    lines = [f"{'figure':<{width}}  " + "  ".join(f"{f'N = {n:,}':>14}" for n in ns)]
    for name in names:
        cells = []
        for n in ns:
            value = results.get(f"{name}_{n}", "")
            text = value if isinstance(value, str) else f"{value:,}"
            cells.append(f"{text[:14]:>14}")
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    others = [f"{k} {v}" for k, v in results.items() if not any(k.endswith(f"_{n}") for n in ns)]
    return "\n".join([*lines, "; ".join(others)])


def write(results: Figures, path: Path = RESULTS) -> None:
    """Merge into the results file; the keys of the Ns run here replace older ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.exists() else {}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({**current, **results}, indent=2, sort_keys=True) + "\n")
    temporary.replace(path)
