"""bench/actions.py (issue 16 P8): Temporal Cloud's billable-action rules on committed histories."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from bench.actions import billable_actions

HISTORIES = Path(__file__).resolve().parents[1] / "replay" / "histories"


def events(name: str) -> list[HistoryEvent]:
    path = HISTORIES / f"{name}.json"
    return list(WorkflowHistory.from_json(name, path.read_text()).events)


def test_a_clean_create_and_a_patch_are_two_actions_each() -> None:
    """NF-6 / WF-1': signal-with-start and one activity; no upsert (the run closes clean,
    `workflows/link.py` theory of operation 4), no idle timer, no local activity (the
    entry knows the budget)."""
    assert billable_actions(events("happy_path_create")) == Counter(signal_with_start=1, activity=1)
    assert billable_actions(events("happy_path_patch")) == Counter(signal_with_start=1, activity=1)


def test_updates_upserts_and_timers_are_counted_by_their_rules() -> None:
    counts = billable_actions(events("ambiguous_then_reconcile"))
    assert counts == Counter(
        signal_with_start=1,
        activity=3,  # the failed POST, the reconcile, the create step after it
        search_attributes=2,  # the park, then its correction once repaired
        update=1,
        timer=1,  # held open for the operator (a re-run of the command)
    )


def test_an_operator_wake_is_a_budget_lookup_hold_timers_and_the_update() -> None:
    # An operator wake carries no budget: the run looks it up (a local activity), waits
    # for the update in a timer, then holds again after it; a re-run with the same
    # update id is answered from the first and costs nothing.
    counts = billable_actions(events("retire_on_a_closed_link"))
    assert counts == Counter(
        signal_with_start=1, activity=3, local_activity_batch=1, timer=2, update=1
    )


def test_a_retried_activity_counts_every_attempt_and_a_plain_start_counts_one() -> None:
    counts = billable_actions(events("action_5xx"))
    assert counts == Counter(start=1, activity=6)  # attempts 1, 1, 2, 2


def test_a_version_marker_upsert_is_free_and_markers_of_one_task_are_one_action() -> None:
    """After the first release `workflow.patched` records a marker and may upsert
    TemporalChangeVersion alone (VER-1): the markers of one task count once, that upsert
    not at all."""
    version = HistoryEvent(event_type=EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)
    fields = version.upsert_workflow_search_attributes_event_attributes.search_attributes
    fields.indexed_fields["TemporalChangeVersion"].data = b'["a-change"]'
    markers = [HistoryEvent(event_type=EventType.EVENT_TYPE_MARKER_RECORDED) for _ in range(2)]
    for marker in markers:
        marker.marker_recorded_event_attributes.workflow_task_completed_event_id = 4
    assert billable_actions([version, *markers]) == Counter(local_activity_batch=1)
