"""bench/p1_series.py (issue 32, items 3 and 4): P1 and P1_io are medians over interleaved
pairs with their spread, growth compares two series, and a P1 run's keys replace the
last run's in latest.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.ingress_bench import record
from bench.p1_series import (
    Pair,
    Rate,
    growth,
    growth_figures,
    median_split,
    series_figures,
    spread,
)


def pair(floor: float, floor_io: float, creates: float, xacts: float | None = None) -> Pair:
    return Pair(
        Rate(floor, {"temporal": 20.0, "crm_and_worker": 10.0}),
        Rate(floor_io, {"temporal": 21.0, "postgres": 2.0}, xacts),
        Rate(creates, {"temporal": 24.0, "postgres": 6.0}, xacts),
    )


def test_the_median_pair_is_reported_with_the_lowest_and_highest() -> None:
    # A host that drifts between rounds: the middle pair is the figure, not the mean.
    pairs = [pair(50, 40, 30, 3.0), pair(40, 40, 36), pair(60, 45, 30)]
    figures = series_figures("", pairs)
    assert (figures["P1"], figures["P1_min"], figures["P1_max"]) == (0.6, 0.5, 0.9)
    assert (figures["P1_io"], figures["P1_io_min"], figures["P1_io_max"]) == (0.75, 0.667, 0.9)
    assert figures["P1_floor_per_s"] == 50.0 and figures["P1_floor_io_per_s"] == 40.0
    assert figures["P1_creates_per_s"] == 30.0 and figures["P1_pairs"] == 3.0
    # Transactions are counted in the rounds that counted them only.
    assert figures["P2"] == 3.0 and figures["P2_floor_io"] == 3.0


def test_each_side_reports_its_cpu_split_under_its_own_keys() -> None:
    figures = series_figures("_n3000", [pair(50, 40, 30)])
    assert figures["P1_n3000_cpu_ms_postgres"] == 6.0  # per create: its issue-16 name
    assert figures["P1_n3000_floor_cpu_ms_crm_and_worker"] == 10.0
    assert figures["P1_n3000_floor_io_cpu_ms_postgres"] == 2.0
    assert "P2_n3000" not in figures  # nothing counted


def test_a_component_missing_from_a_round_counts_zero_there() -> None:
    assert median_split([{"a": 1.0}, {"a": 3.0, "b": 3.0}, {}]) == {"a": 2.0, "b": 1.5}


def test_growth_is_the_ratio_of_medians_spread_over_every_combination() -> None:
    value = growth([0.6, 0.8, 0.7], [0.7, 0.56, 0.63])
    assert (value.median, value.low, value.high) == pytest.approx((0.9, 0.7, 0.7 / 0.6))
    figures = growth_figures([pair(50, 40, 30)], [pair(50, 40, 25)])
    assert figures["P1_growth"] == figures["P1_growth_min"] == figures["P1_growth_max"] == 0.833
    assert figures["P1_io_growth"] == 0.833


def test_a_spread_prints_its_median_and_range() -> None:
    assert str(spread([0.5, 0.72, 0.61])) == "0.61 [0.50-0.72]"


def test_a_p1_run_replaces_the_last_runs_keys_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "latest.json"
    path.write_text(json.dumps({"P1_floor_after_per_s": 48.0, "P2_n3000": 3.0, "P4": 2635}))
    record({"P1": 0.7, "P2": 3.0}, path, replaces=("P1", "P2", "P8"))
    assert json.loads(path.read_text()) == {"P1": 0.7, "P2": 3.0, "P4": 2635}
    record({"P5_rss_mb": 224.0}, path)  # other parts keep every key
    assert json.loads(path.read_text())["P1"] == pytest.approx(0.7)
