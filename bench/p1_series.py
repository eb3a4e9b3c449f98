"""P1's interleaved rounds and what is reported of them (issue 32): each pair is a floor
round, a floor_io round and a product round, one after the other, and a figure is the
median over the pairs with its spread (lowest and highest), so a drifting host shows as
spread instead of moving one side of a ratio."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product

from bench.cpu import describe

TARGETS = {"P1": 0.75, "P1_io": 0.9, "growth": 0.95, "P2": 3.0}


@dataclass(frozen=True)
class Rate:
    """One round's rate: workflows (or creates) per second, its CPU per unit by component
    (bench.cpu), and, where the round counted them, Postgres transactions per unit."""

    per_s: float
    cpu_ms: dict[str, float]
    transactions: float | None = None


@dataclass(frozen=True)
class Pair:
    floor: Rate
    floor_io: Rate
    product: Rate

    @property
    def p1(self) -> float:
        return self.product.per_s / self.floor.per_s

    @property
    def p1_io(self) -> float:
        return self.product.per_s / self.floor_io.per_s


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f} [{self.low:.2f}-{self.high:.2f}]"


def spread(values: Sequence[float]) -> Spread:
    return Spread(statistics.median(values), min(values), max(values))


def median_split(splits: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each component's median CPU per unit over the rounds that report a split."""
    present = [s for s in splits if s]
    parts = sorted({part for s in present for part in s})
    return {p: round(statistics.median(s.get(p, 0.0) for s in present), 1) for p in parts}


def growth(small: Sequence[float], large: Sequence[float]) -> Spread:
    """The large-N ratio's median over the small-N ratio's; the spread runs over every
    (small round, large round) combination, since no round of one is paired with one of
    the other."""
    ratios = [b / a for a, b in product(small, large)]
    return Spread(statistics.median(large) / statistics.median(small), min(ratios), max(ratios))


def _spread_keys(name: str, value: Spread) -> dict[str, float]:
    return {
        name: round(value.median, 3),
        f"{name}_min": round(value.low, 3),
        f"{name}_max": round(value.high, 3),
    }


def series_figures(suffix: str, pairs: Sequence[Pair]) -> dict[str, float]:
    """The latest.json keys of one series; `suffix` is "" at N or "_n3000" at growth N."""
    figures = {
        **_spread_keys(f"P1{suffix}", spread([p.p1 for p in pairs])),
        **_spread_keys(f"P1_io{suffix}", spread([p.p1_io for p in pairs])),
        f"P1{suffix}_pairs": float(len(pairs)),
    }
    sides = _sides(pairs)
    for side, rates in sides.items():
        figures[f"P1{suffix}_{side}_per_s"] = round(statistics.median(r.per_s for r in rates), 1)
        cpu = median_split([r.cpu_ms for r in rates])
        figures |= {f"P1{suffix}_{_cpu_prefix(side)}cpu_ms_{part}": ms for part, ms in cpu.items()}
    for name, side in (("P2", "creates"), ("P2_floor_io", "floor_io")):
        counted = _counted(sides[side])
        if counted:
            figures[f"{name}{suffix}"] = round(statistics.median(counted), 3)
    return figures


def _counted(rates: Sequence[Rate]) -> list[float]:
    return [r.transactions for r in rates if r.transactions is not None]


def growth_figures(small: Sequence[Pair], large: Sequence[Pair]) -> dict[str, float]:
    return {
        **_spread_keys("P1_growth", growth([p.p1 for p in small], [p.p1 for p in large])),
        **_spread_keys("P1_io_growth", growth([p.p1_io for p in small], [p.p1_io for p in large])),
    }


def _sides(pairs: Sequence[Pair]) -> dict[str, list[Rate]]:
    return {
        "creates": [p.product for p in pairs],
        "floor": [p.floor for p in pairs],
        "floor_io": [p.floor_io for p in pairs],
    }


def _cpu_prefix(side: str) -> str:
    """`P1_cpu_ms_*` is per create (its name since issue 16); the floors name themselves."""
    return "" if side == "creates" else f"{side}_"


def pair_line(label: str, k: int, pair: Pair) -> str:
    return (
        f"{label} pair {k + 1}: floor {pair.floor.per_s:.1f}/s, floor_io "
        f"{pair.floor_io.per_s:.1f}/s, creates {pair.product.per_s:.1f}/s: "
        f"P1 {pair.p1:.2f}, P1_io {pair.p1_io:.2f}"
    )


def summary(label: str, pairs: Sequence[Pair]) -> str:
    """The series' report: medians [min-max] against their targets, then the CPU split."""
    sides = _sides(pairs)
    rates = ", ".join(
        f"{side} {statistics.median(r.per_s for r in rs):.1f}/s" for side, rs in sides.items()
    )
    counted = {"create": sides["creates"], "floor_io workflow": sides["floor_io"]}
    xacts = "; ".join(
        f"{statistics.median(c):.2f} Postgres transactions/{unit}"
        for unit, c in ((u, _counted(rs)) for u, rs in counted.items())
        if c
    )
    cpu = {side: describe(median_split([r.cpu_ms for r in rs])) for side, rs in sides.items()}
    return "\n".join(
        [
            f"{label}  median of {len(pairs)} pairs [min-max]: "
            f"P1 = {spread([p.p1 for p in pairs])} (target >= {TARGETS['P1']}), "
            f"P1_io = {spread([p.p1_io for p in pairs])} (target >= {TARGETS['P1_io']})",
            f"  medians: {rates}; {xacts} (P2 target <= {TARGETS['P2']:g})",
            f"  CPU per floor workflow:    {cpu['floor']}",
            f"  CPU per floor_io workflow: {cpu['floor_io']}",
            f"  CPU per create:            {cpu['creates']}",
        ]
    )
