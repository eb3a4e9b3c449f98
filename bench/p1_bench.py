"""Benchmark P1 and its companions on one private stack (issue 32, item 4: a measurement
that holds still):

1. warm-up: a product round, a floor round and a floor_io round of BENCH_WARMUP_N,
   not reported (the server's caches, the worker's, Postgres's and the sandbox's);
2. at N, PAIRS interleaved pairs: floor, floor_io, product, floor, floor_io, product, ...
   P1 (creates/s over floor/s) and P1_io (over floor_io/s) are medians over the pairs,
   with their lowest and highest; P2 is counted in the first pair;
3. P8 from the first pair's creates (and a PATCH round over them) and its floor;
4. growth: the same PAIRS at `growth_n` on the same stack, after the rounds before
   (tables, indexes and Temporal's history store already hold their rows), and
   P1_growth = P1 at `growth_n` over P1 at N (the same for P1_io).

Every round saves fresh records, so the stack is seeded with all of them at its start.
"""

from __future__ import annotations

from bench.create_bench import action_figures, create_round, log
from bench.floor_io import RowTemplate, prepare
from bench.floor_rounds import floor_io_rate, floor_rate
from bench.p1_series import (
    TARGETS,
    Pair,
    Rate,
    growth,
    growth_figures,
    pair_line,
    series_figures,
    summary,
)
from bench.stack import BenchStack, bench_stack

PAIRS = 3
WARMUP_N = 100


async def warm_up(stack: BenchStack, n: int) -> RowTemplate:
    """Records 0..n-1 through the product, then both floors; returns floor_io's row
    template, read from an attempt the product finalized."""
    log(f"warm-up: {n} creates, {n} floor and {n} floor_io workflows")
    await create_round(stack.client, stack, 0, n, count=False)
    template = await prepare(stack.dsn)
    await floor_rate(stack.client, stack.processes, n, prefix="warm-up")
    await floor_io_rate(stack, template, n, "warm-up", count=False)
    return template


def floor_prefix(n: int, pair: int) -> str:
    return f"n{n}-{pair}"


async def series(
    stack: BenchStack, template: RowTemplate, first: int, n: int, pairs: int
) -> tuple[list[Pair], list[str]]:
    """`pairs` interleaved pairs of N, saving records first.. onwards; the pairs, and the
    first pair's link workflow ids (for P8)."""
    client, label = stack.client, f"N={n}"
    result: list[Pair] = []
    first_ids: list[str] = []
    for k in range(pairs):
        prefix = floor_prefix(n, k)
        log(f"{label} pair {k + 1}/{pairs}: floor, floor_io, creates")
        floor = await floor_rate(client, stack.processes, n, prefix)
        floor_io = await floor_io_rate(stack, template, n, prefix, count=k == 0)
        created = await create_round(client, stack, first + k * n, n, count=k == 0)
        first_ids = first_ids or created.link_workflow_ids
        product = Rate(created.creates_per_s, created.cpu_ms, created.transactions_per_create)
        result.append(Pair(floor, floor_io, product))
        log(pair_line(label, k, result[-1]))
    print(summary(label, result))
    return result, first_ids


async def run_create_bench(
    n: int, growth_n: int, pairs: int = PAIRS, warmup_n: int = WARMUP_N
) -> dict[str, float]:
    """P1, P1_io, P2 and P8 at N, then P1, P1_io and P2 at `growth_n` (0: skip) and the
    growth between them, all on one stack; returns the latest.json figures."""
    if pairs < 1 or warmup_n < 1:
        raise SystemExit("bench: P1 needs at least one pair and one warm-up create")
    async with bench_stack(warmup_n + pairs * (n + growth_n), rate_limited=False) as stack:
        template = await warm_up(stack, warmup_n)
        small, ids = await series(stack, template, warmup_n, n, pairs)
        results = series_figures("", small)
        p8 = await action_figures(stack.client, stack, warmup_n, ids, floor_prefix(n, 0))
        print(
            f"P8 = {p8.create:.2f} actions/create (target <= 3), {p8.patch:.2f} actions/PATCH "
            f"(target <= 2); the floor: {p8.floor_create:.2f} per create, "
            f"{p8.floor_patch:.2f} per PATCH"
        )
        results |= {
            "P8_create": round(p8.create, 2),
            "P8_patch": round(p8.patch, 2),
            "P8_floor_create": round(p8.floor_create, 2),
            "P8_floor_patch": round(p8.floor_patch, 2),
        }
        if growth_n:
            large, _ = await series(stack, template, warmup_n + pairs * n, growth_n, pairs)
            results |= series_figures(f"_n{growth_n}", large)
            results |= growth_figures(small, large)
            p1 = growth([p.p1 for p in small], [p.p1 for p in large])
            io = growth([p.p1_io for p in small], [p.p1_io for p in large])
            print(
                f"growth N={growth_n} over N={n}: P1 {p1}, P1_io {io} "
                f"(target >= {TARGETS['growth']})"
            )
    return results
