"""What Temporal's workflow sandbox costs a create, and the floor_io workflow (issue 32,
item 5): `make bench ONLY=SANDBOX`.

The product runs its workflows in the SDK's sandbox, which re-executes each workflow
module for every new run (fresh module state) and checks every call the workflow makes.
Every create is a new run (WF-1'), so the sandbox is paid per create. This part measures
it the way P1 is measured, on one private stack:

1. warm-up as P1 (bench/p1_bench.warm_up);
2. `pairs` interleaved pairs, each four rounds of N: floor_io sandboxed and not, then
   the product's creates sandboxed and not (the runner order flips every pair, so a
   drifting host does not favour one side);
3. per side, the median paired difference of CPU per unit by component (what the sandbox
   costs) and of throughput; and P1_io three ways: both sandboxed (as P1 measures it),
   both unsandboxed, and the product alone unsandboxed against the floor as defined.

It measures a design choice the product did not take (docs/testing-and-benchmarks.md):
the product's worker always runs sandboxed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Final

from bench.create_bench import create_round, log
from bench.floor_io import RowTemplate
from bench.floor_rounds import floor_io_rate
from bench.p1_bench import warm_up
from bench.p1_series import Rate
from bench.stack import BenchStack, bench_stack

SIDES: Final = ("floor_io", "creates")
RUNNERS: Final = ("sandboxed", "unsandboxed")
PREFIX: Final = "workflow_sandbox_"  # latest.json keys ("sandbox" is the remote's CPU)

# One pair: a Rate for each (side, runner).
Quad = Mapping[tuple[str, str], Rate]


def pair_order(k: int) -> list[tuple[str, str]]:
    """The rounds of pair `k`: floor_io then creates, the runner order flipped every pair."""
    runners = RUNNERS if k % 2 == 0 else RUNNERS[::-1]
    return [(side, runner) for side in SIDES for runner in runners]


def _total(rate: Rate) -> float:
    return sum(rate.cpu_ms.values())


def sandbox_figures(pairs: Sequence[Quad]) -> dict[str, float]:
    """The latest.json keys: per side, the sandbox's CPU per unit (median paired difference,
    in total and by component) and the throughput unsandboxed over sandboxed; P1_io three
    ways."""
    if not pairs:
        raise ValueError("no pairs measured")
    figures: dict[str, float] = {f"{PREFIX}pairs": float(len(pairs))}
    for side in SIDES:
        inside = [p[(side, "sandboxed")] for p in pairs]
        outside = [p[(side, "unsandboxed")] for p in pairs]
        figures[f"{PREFIX}{side}_cpu_ms"] = _median_diff(
            [_total(a) for a in inside], [_total(b) for b in outside]
        )
        parts = sorted({part for r in inside + outside for part in r.cpu_ms})
        for part in parts:
            figures[f"{PREFIX}{side}_cpu_ms_{part}"] = _median_diff(
                [a.cpu_ms.get(part, 0.0) for a in inside],
                [b.cpu_ms.get(part, 0.0) for b in outside],
            )
        figures[f"{PREFIX}{side}_speedup"] = round(
            statistics.median(b.per_s / a.per_s for a, b in zip(inside, outside, strict=True)), 3
        )
    ways = {
        "P1_io": ("sandboxed", "sandboxed"),
        "P1_io_both_unsandboxed": ("unsandboxed", "unsandboxed"),
        "P1_io_product_unsandboxed": ("sandboxed", "unsandboxed"),
    }
    for name, (floor, product) in ways.items():
        ratios = [p[("creates", product)].per_s / p[("floor_io", floor)].per_s for p in pairs]
        figures[f"{PREFIX}{name}"] = round(statistics.median(ratios), 3)
    return figures


def _median_diff(inside: Sequence[float], outside: Sequence[float]) -> float:
    return round(statistics.median(a - b for a, b in zip(inside, outside, strict=True)), 2)


def sandbox_summary(figures: Mapping[str, float]) -> str:
    lines = [f"workflow sandbox, median of {figures[f'{PREFIX}pairs']:g} pairs:"]
    for side, unit in (("creates", "create"), ("floor_io", "floor_io workflow")):
        lines.append(
            f"  per {unit}: {figures[f'{PREFIX}{side}_cpu_ms']:.1f} ms of CPU "
            f"({figures.get(f'{PREFIX}{side}_cpu_ms_crm_and_worker', 0.0):.1f} in the worker's "
            f"process); unsandboxed runs {figures[f'{PREFIX}{side}_speedup']:.2f}x as fast"
        )
    lines.append(
        f"  P1_io: {figures[f'{PREFIX}P1_io']:.2f} both sandboxed, "
        f"{figures[f'{PREFIX}P1_io_both_unsandboxed']:.2f} both unsandboxed, "
        f"{figures[f'{PREFIX}P1_io_product_unsandboxed']:.2f} the product alone unsandboxed"
    )
    return "\n".join(lines)


async def _pair(stack: BenchStack, template: RowTemplate, first: int, n: int, k: int) -> Quad:
    rates: dict[tuple[str, str], Rate] = {}
    for side, runner in pair_order(k):
        sandboxed = runner == "sandboxed"
        if side == "floor_io":
            prefix = f"sbx{k}-{runner}"
            rates[(side, runner)] = await floor_io_rate(
                stack, template, n, prefix, count=False, sandboxed=sandboxed
            )
        else:
            created = await create_round(
                stack.client, stack, first, n, count=False, sandboxed=sandboxed
            )
            first += n
            rates[(side, runner)] = Rate(created.creates_per_s, created.cpu_ms)
        rate = rates[(side, runner)]
        log(f"pair {k + 1}: {side} {runner}: {rate.per_s:.1f}/s, {_total(rate):.1f} ms CPU")
    return rates


async def run_sandbox_bench(n: int, pairs: int, warmup_n: int) -> dict[str, float]:
    if n < 1 or pairs < 1 or warmup_n < 1:
        raise SystemExit("bench: SANDBOX needs N, pairs and warm-up of at least 1")
    async with bench_stack(warmup_n + pairs * 2 * n) as stack:
        template = await warm_up(stack, warmup_n)
        quads = [await _pair(stack, template, warmup_n + k * 2 * n, n, k) for k in range(pairs)]
    figures = sandbox_figures(quads)
    print(sandbox_summary(figures))
    return figures
