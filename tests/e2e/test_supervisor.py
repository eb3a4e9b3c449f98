"""The dev supervisor (issue 13): a child that exits is restarted with a doubling backoff and
one log line per event; one that keeps dying young stops the stack. Real child processes
(`connector-push no-such-command` exits 2 at once); the clock is passed in, so the
backoff is asserted without waiting it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.stack.supervisor import MAX_YOUNG_DEATHS, ChildKeepsFailing, Supervisor


def test_a_child_dying_young_is_restarted_with_backoff_then_stops_the_stack(
    tmp_path: Path,
) -> None:
    supervisor = Supervisor(tmp_path)
    child = supervisor.spawn_cli("broken", ["no-such-command"], {}, now=0.0)
    now, delays = 0.0, []
    try:
        with pytest.raises(ChildKeepsFailing) as stopped:
            for _ in range(MAX_YOUNG_DEATHS):
                assert child.process.wait(timeout=60) == 2
                [line] = supervisor.tend(now)
                assert line.startswith(f"broken exited (exit 2); restart #{child.restarts + 1} in ")
                delays.append(child.restart_at - now if child.restart_at else None)
                assert supervisor.tend(now) == []  # nothing before the backoff is over
                now = child.restart_at or now
                [line] = supervisor.tend(now)
                assert line.startswith(f"broken restarted (restart #{child.restarts}, pid ")
        assert "broken keeps failing at start (exit 2, 5 times in a row)" in str(stopped.value)
    finally:
        supervisor.stop_all(timeout_s=10)
    assert delays == [1.0, 2.0, 4.0, 8.0]


def test_a_child_that_ran_a_while_restarts_after_the_shortest_backoff(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path)
    child = supervisor.spawn_cli("flaky", ["no-such-command"], {}, now=0.0)
    try:
        child.young_deaths = 3  # it had died young before, then ran for 60 s
        assert child.process.wait(timeout=60) == 2
        [line] = supervisor.tend(60.0)
        assert line.startswith("flaky exited (exit 2); restart #1 in 1s")
    finally:
        supervisor.stop_all(timeout_s=10)
