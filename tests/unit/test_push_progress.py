"""`push`'s progress line (issue 33 item 5): the time left at the budget's pace, or
"unknown" when no rate limit is declared, and one line per interval when piped."""

from __future__ import annotations

import io

from cli.push_cmd import in_flight_cap
from cli.push_progress import ProgressLines, Scope, Tally, duration, progress_line


def _tally(admitted: int, finalized: int, parked: int = 0) -> Tally:
    tally = Tally(admitted=admitted)
    tally.statuses = {"finalized": finalized, "terminal_failed": parked}
    tally.skipped_linked = 50
    tally.rejected["required_field_missing"] = 3
    return tally


def test_time_left_is_what_remains_at_the_budgets_pace() -> None:
    tally = _tally(admitted=200, finalized=100, parked=1)
    # 1000 records: 253 considered (200 admitted, 3 rejected, 50 linked), so 747 still to
    # consider plus 99 admitted and unsettled: 846 saves at 9 requests/s = 94 s.
    line = progress_line(tally, Scope(records=1000, limit=None, per_second=9.0))
    assert "admitted 200, finalized 100, parked 1, rejected 3, skipped 50 linked + 0 active" in line
    assert line.endswith("846 saves left, time left ~1m34s at the budget's pace (9.0 requests/s)")
    limited = progress_line(tally, Scope(records=1000, limit=250, per_second=9.0))
    assert "149 saves left" in limited  # 50 more to admit under --limit, 99 unsettled


def test_time_left_is_unknown_without_a_declared_limit() -> None:
    line = progress_line(_tally(admitted=1, finalized=0), Scope(10, None, None))
    assert line.endswith("time left: unknown (no rate limit declared for the budget)")


def test_durations() -> None:
    durations = [duration(s) for s in (12.2, 250, 3 * 3600 + 5 * 60 + 40)]
    assert durations == ["~12s", "~4m10s", "~3h05m"]


def test_one_line_per_interval_the_first_at_once() -> None:
    now = [0.0]
    out = io.StringIO()
    lines = ProgressLines(Scope(10, None, 1.0), 5.0, stream=lambda: out, clock=lambda: now[0])
    tally = _tally(admitted=1, finalized=0)
    for t in (0.0, 1.0, 4.9, 5.0, 9.0, 10.1):
        now[0] = t
        lines.tick(tally)
    assert len(out.getvalue().splitlines()) == 3  # at 0, 5.0 and 10.1


def test_a_closed_stderr_stops_the_lines_not_the_push() -> None:
    closed = io.StringIO()
    closed.close()
    lines = ProgressLines(Scope(10, None, 1.0), 0.1, stream=lambda: closed, clock=lambda: 0.0)
    lines.tick(_tally(admitted=1, finalized=0))  # ValueError: I/O operation on closed file
    lines.tick(_tally(admitted=2, finalized=0))


def test_a_run_waiting_for_its_budget_says_so() -> None:
    """NF-8: while admission waits for room under `--ahead`, the line says why it is not
    admitting, and how many of the run's saves are in flight."""
    tally = _tally(admitted=300, finalized=0)
    scope = Scope(records=1000, limit=None, per_second=10.0)
    assert "budget's pace (" not in progress_line(tally, scope).split("requests/s)")[-1]
    tally.paced_at = 300
    assert progress_line(tally, scope).endswith(
        "(10.0 requests/s); admitting at the budget's pace (300 in flight)"
    )


def test_the_in_flight_cap_is_ahead_seconds_of_the_budget() -> None:
    assert in_flight_cap(10.0, 30.0, 8) == 300
    assert in_flight_cap(0.1, 30.0, 8) == 8  # never fewer than the wake-ups in flight
    assert in_flight_cap(None, 30.0, 8) is None  # no rate declared: no cap
    assert in_flight_cap(10.0, 0.0, 8) is None  # --ahead 0
