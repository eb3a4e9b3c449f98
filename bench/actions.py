"""Temporal Cloud billable actions, counted from a workflow run's event history (P8).

The rules, one per event kind, are those of the Temporal Cloud documentation page
"Temporal Cloud Actions" (docs.temporal.io/cloud/actions; source
temporalio/documentation, docs/evaluate/temporal-cloud/actions.mdx). This module is
their only home: the bench counts our LinkWorkflows and the floor workflow with it.

- Workflow started (client start, continue-as-new, reset): 1. A child's start is
  billed to its parent (2, below), so a run started by a parent counts 0 here.
- Signal-With-Start: 1 in total, "regardless of whether the Workflow starts". A
  start by signal-with-start is the only start whose event 2 is the signal (a plain
  start schedules its first workflow task as event 2), so that signal counts 0.
- Signal received: 1 each (a signal from another workflow is counted where it is
  received, so summing several histories counts it once).
- Activity started or retried: 1 per attempt. The history keeps one started event
  per activity, carrying the attempt number of the try that finished it.
- Local activities: all markers recorded in one workflow task count 1 ("Temporal
  Cloud counts all RecordMarkers from each Workflow Task as one action"); this
  includes `workflow.patched` markers, which is the conservative reading.
- Timer started: 1 (the SDK's timeout timers too).
- Search-attribute upsert: 1 per command, however many attributes it sets; an
  upsert of `TemporalChangeVersion` alone (workflow versioning) is exempt.
- Update accepted: 1 (rejected updates are billed too but never reach the history).
- Child workflow started: 2 (the start and the execution). Nexus operation
  scheduled or cancel requested: 1. Workflow execution options updated: 1.

Not in a history, so not counted here (the page says the same of its own estimate):
queries, activity heartbeats, rejected updates, schedules, export, and the
fairness-key dispatch Temporal Cloud bills as actions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

VERSION_ATTRIBUTE = "TemporalChangeVersion"

# Event kinds that are always exactly one action, by the name the breakdown uses.
_ONE_EACH = {
    EventType.EVENT_TYPE_TIMER_STARTED: "timer",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "update",
    EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED: "nexus",
    EventType.EVENT_TYPE_NEXUS_OPERATION_CANCEL_REQUESTED: "nexus",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED: "options",
}


def billable_actions(events: Sequence[HistoryEvent]) -> Counter[str]:
    """Billable actions of one run's history, by kind (`sum(...values())` is the total)."""
    counts: Counter[str] = Counter()
    counts.update(_start(events))
    counts["signal"] += sum(
        1 for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ) - int(_started_by_signal(events))
    counts["activity"] += sum(
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    )
    counts["local_activity_batch"] += _marker_batches(events)
    counts["search_attributes"] += sum(1 for e in events if _billed_upsert(e))
    counts["child_workflow"] += 2 * sum(
        1
        for e in events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    )
    counts.update(_ONE_EACH[e.event_type] for e in events if e.event_type in _ONE_EACH)
    return +counts  # drop the zero kinds


def _start(events: Sequence[HistoryEvent]) -> Iterable[str]:
    if not events or events[0].event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        return  # a page from the middle of a history: its start is elsewhere
    started = events[0].workflow_execution_started_event_attributes
    if started.HasField("parent_workflow_execution"):
        return  # billed to the parent with the child-workflow action
    yield "signal_with_start" if _started_by_signal(events) else "start"


def _started_by_signal(events: Sequence[HistoryEvent]) -> bool:
    return (
        len(events) > 1
        and events[0].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
        and events[1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    )


def _marker_batches(events: Sequence[HistoryEvent]) -> int:
    tasks = {
        e.marker_recorded_event_attributes.workflow_task_completed_event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    }
    return len(tasks)


def _billed_upsert(event: HistoryEvent) -> bool:
    if event.event_type != EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        return False
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
    return set(fields.indexed_fields) != {VERSION_ATTRIBUTE}


def total(counts: Counter[str]) -> int:
    return sum(counts.values())
