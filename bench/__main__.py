"""`python -m bench [--only P1,P4,...]` (`make bench ONLY=P4`): every benchmark, or the
parts named, each merging its figures into bench/results/latest.json.

Parts: P1 (with P1_io, P2, P8 and the growth round: `p1_bench`), P3 (`ingress_bench`),
P4 (`revalidation_bench`), P5 (`parked_bench`), P6 (`rate_bench`: at 20, 100 and 190
requests per 10 s), P7 (`saves_bench`), P10 (`rate_p10`: BENCH_P10_N, 20000), P9
(`wal_bench`: WAL bytes per create, BENCH_P9_N, 3000).
P1_IO, P2, P8 and `growth` name the P1 part. Run only when named: SANDBOX (`sandbox_cost`:
what the workflow sandbox costs a create and the floor_io workflow; BENCH_SANDBOX_N, 200;
BENCH_SANDBOX_PAIRS, 4). Sizes: BENCH_N (300), BENCH_GROWTH_N (3000;
0 skips the growth round), BENCH_PAIRS (3 interleaved floor/floor_io/product pairs per
size), BENCH_WARMUP_N (100), BENCH_P4_N (100000), BENCH_P5_N (10000); BENCH_P5_ARMS
(e.g. product,gc-default) makes P5 an A/B of the worker's memory (`parked_bench.ARMS`).
A quick P1, as a check that it runs (its figures mean little): BENCH_N=30
BENCH_GROWTH_N=0 with ONLY=P1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable

from bench.ingress_bench import record, run_ingress_bench
from bench.p1_bench import PAIRS, WARMUP_N, run_create_bench
from bench.parked_bench import arm_names, run_arms, run_parked_bench
from bench.rate_bench import run_rate_bench
from bench.rate_p10 import run_p10_bench
from bench.revalidation_bench import run_revalidation_bench
from bench.sandbox_cost import PREFIX as SANDBOX_PREFIX
from bench.sandbox_cost import run_sandbox_bench
from bench.saves_bench import run_saves_bench
from bench.wal_bench import run_wal_bench
from worker.gc_policy import apply_gc_policy


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


async def _creates() -> None:
    figures = await run_create_bench(
        _env("BENCH_N", 300),
        _env("BENCH_GROWTH_N", 3000),
        _env("BENCH_PAIRS", PAIRS),
        _env("BENCH_WARMUP_N", WARMUP_N),
    )
    record(figures, replaces=("P1", "P2", "P8"))  # no key of an earlier P1 run stays


async def _revalidation() -> None:
    await run_revalidation_bench(_env("BENCH_P4_N", 100_000))


async def _parked() -> None:
    if arms := arm_names(os.environ.get("BENCH_P5_ARMS")):  # an A/B instead (parked_bench)
        await run_arms(arms, _env("BENCH_P5_N", 10_000))
    else:
        await run_parked_bench(_env("BENCH_P5_N", 10_000))


async def _ingress() -> None:
    await run_ingress_bench()  # P3 (issue 7): its own Postgres


async def _saves() -> None:
    await run_saves_bench()  # P7 (issue 12): the HTTP save API


async def _rate() -> None:
    await run_rate_bench()  # P6 (issues 12, 33): push against a rate-limited remote, two workers


async def _fair() -> None:
    await run_p10_bench(_env("BENCH_P10_N", 20_000))  # P10 (issue 33): tenants fair


async def _wal() -> None:
    await run_wal_bench(_env("BENCH_P9_N", 3000), _env("BENCH_WARMUP_N", WARMUP_N))  # P9


async def _sandbox() -> None:
    figures = await run_sandbox_bench(
        _env("BENCH_SANDBOX_N", 200),
        _env("BENCH_SANDBOX_PAIRS", 4),
        _env("BENCH_WARMUP_N", WARMUP_N),
    )
    record(figures, replaces=(SANDBOX_PREFIX,))


# In the order `make bench` runs them.
PARTS: dict[str, Callable[[], Awaitable[None]]] = {
    "P1": _creates,
    "P3": _ingress,
    "P7": _saves,
    "P6": _rate,
    "P10": _fair,
    "P4": _revalidation,
    "P5": _parked,
    "P9": _wal,
}
ALIASES = {"P1_IO": "P1", "P2": "P1", "P8": "P1", "GROWTH": "P1"}
# Parts that run only when named: they measure a design choice, not a target.
NAMED_ONLY: dict[str, Callable[[], Awaitable[None]]] = {"SANDBOX": _sandbox}


def selected(only: str | None) -> list[str]:
    """The parts to run, in run order; an unknown name is an error naming the known ones."""
    if not only:
        return list(PARTS)
    names = {ALIASES.get(n.strip().upper(), n.strip().upper()) for n in only.split(",")}
    unknown = sorted(names - PARTS.keys() - NAMED_ONLY.keys())
    if unknown:
        known = ", ".join([*PARTS, *ALIASES, *NAMED_ONLY])
        raise SystemExit(f"bench: unknown part(s) {', '.join(unknown)}; known: {known}")
    return [name for name in [*PARTS, *NAMED_ONLY] if name in names]


async def main(parts: list[str]) -> None:
    # The worker process's policy (worker.main.run_worker applies it once imports are
    # done): the bench runs the product's worker, and the floor's, in this process.
    apply_gc_policy()
    for name in parts:
        await (PARTS | NAMED_ONLY)[name]()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=os.environ.get("ONLY"), help="e.g. P4 or P1,P5")
    asyncio.run(main(selected(parser.parse_args().only)))
