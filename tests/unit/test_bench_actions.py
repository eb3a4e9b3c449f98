"""bench/actions.py (issue 16 P8): Temporal Cloud's billable-action rules on committed histories."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from bench.actions import billable_actions, total

HISTORIES = Path(__file__).resolve().parents[1] / "replay" / "histories"


def events(name: str) -> list[HistoryEvent]:
    path = HISTORIES / f"{name}.json"
    return list(WorkflowHistory.from_json(name, path.read_text()).events)


def test_a_create_is_signal_with_start_one_activity_one_upsert_and_the_idle_timer() -> None:
    history = events("happy_path_then_patch")
    create = [e for e in history if e.event_id <= 13]  # up to the idle timer
    assert billable_actions(create) == Counter(
        signal_with_start=1, activity=1, search_attributes=1, timer=1
    )
    # The PATCH: the save's signal, the create step finding nothing, the PATCH, a new timer.
    assert billable_actions(history) - billable_actions(create) == Counter(
        signal=1, activity=2, timer=1
    )
    assert total(billable_actions(history)) == 8


def test_patch_markers_batch_per_task_and_version_upserts_and_unstarted_activities_are_free() -> (
    None
):
    counts = billable_actions(events("ambiguous_then_reconcile_parked_open"))
    assert counts == Counter(
        signal_with_start=1,
        activity=2,  # the failed POST and the reconcile; the last one is only scheduled
        search_attributes=2,  # the TemporalChangeVersion-only upsert is exempt
        local_activity_batch=1,  # the patched() marker's workflow task
        update=1,
    )


def test_a_retried_activity_counts_every_attempt_and_a_plain_start_counts_one() -> None:
    counts = billable_actions(events("action_5xx"))
    assert counts == Counter(start=1, activity=6)  # attempts 1, 1, 2, 2
