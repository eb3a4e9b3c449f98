"""bench/sandbox_cost.py (issue 32, item 5): what the workflow sandbox costs is the median
paired difference between sandboxed and unsandboxed rounds, the runner order flips every
pair, and the part runs only when named."""

from __future__ import annotations

import pytest

from bench.__main__ import PARTS, selected
from bench.p1_series import Rate
from bench.sandbox_cost import PREFIX, Quad, pair_order, sandbox_figures, sandbox_summary


def quad(
    floor_in: float, floor_out: float, creates_in: float, creates_out: float, worker_ms: float
) -> Quad:
    """Rates per second; the sandbox costs `worker_ms` in the product's process, half that
    in the floor's, and nothing in Temporal."""
    return {
        ("floor_io", "sandboxed"): Rate(floor_in, {"temporal": 20.0, "crm_and_worker": 14.0}),
        ("floor_io", "unsandboxed"): Rate(
            floor_out, {"temporal": 20.0, "crm_and_worker": 14.0 - worker_ms / 2}
        ),
        ("creates", "sandboxed"): Rate(creates_in, {"temporal": 30.0, "crm_and_worker": 21.0}),
        ("creates", "unsandboxed"): Rate(
            creates_out, {"temporal": 30.0, "crm_and_worker": 21.0 - worker_ms}
        ),
    }


def test_each_pair_runs_floor_io_first_and_flips_the_runner_order() -> None:
    assert pair_order(0) == [
        ("floor_io", "sandboxed"),
        ("floor_io", "unsandboxed"),
        ("creates", "sandboxed"),
        ("creates", "unsandboxed"),
    ]
    assert pair_order(1) == [
        ("floor_io", "unsandboxed"),
        ("floor_io", "sandboxed"),
        ("creates", "unsandboxed"),
        ("creates", "sandboxed"),
    ]


def test_the_cost_is_the_median_paired_difference_by_component() -> None:
    figures = sandbox_figures([quad(40, 44, 30, 34, 6.0), quad(50, 52, 36, 40, 4.0)] * 2)
    assert figures[f"{PREFIX}creates_cpu_ms"] == pytest.approx(5.0)
    assert figures[f"{PREFIX}creates_cpu_ms_crm_and_worker"] == pytest.approx(5.0)
    assert figures[f"{PREFIX}creates_cpu_ms_temporal"] == 0.0
    assert figures[f"{PREFIX}floor_io_cpu_ms"] == pytest.approx(2.5)
    assert figures[f"{PREFIX}pairs"] == 4.0


def test_p1_io_is_reported_three_ways() -> None:
    figures = sandbox_figures([quad(40, 50, 30, 45, 6.0)])
    assert figures[f"{PREFIX}P1_io"] == pytest.approx(0.75)
    assert figures[f"{PREFIX}P1_io_both_unsandboxed"] == pytest.approx(0.9)
    assert figures[f"{PREFIX}P1_io_product_unsandboxed"] == pytest.approx(1.125)
    assert figures[f"{PREFIX}creates_speedup"] == pytest.approx(1.5)
    assert figures[f"{PREFIX}floor_io_speedup"] == pytest.approx(1.25)
    assert "0.75 both sandboxed" in sandbox_summary(figures)


def test_no_pairs_is_an_error() -> None:
    with pytest.raises(ValueError, match="no pairs"):
        sandbox_figures([])


def test_the_sandbox_part_runs_only_when_named() -> None:
    assert "SANDBOX" not in selected(None)
    assert selected(None) == list(PARTS)
    assert selected("sandbox,P1") == ["P1", "SANDBOX"]
    with pytest.raises(SystemExit, match=r"known: .*SANDBOX"):
        selected("P99")
