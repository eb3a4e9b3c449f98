"""LinkWorkflow change ids (`workflow.patched`) and the ones every new run is born with.

Outside replay, the first evaluation of `workflow.patched(id)` in a run records a
marker in its history, and Temporal Cloud bills the markers of one workflow task as one
action (`bench.actions`, P8). Every starter of a LinkWorkflow — `services.wake`
(`signal_with_start`, the one place a run is started) and the workflow's own
continue-as-new — runs code that knows the changes listed in `BORN_WITH`, so it names
them in the run's input (`LinkWorkflowInput.patches`) and the run takes their new path
without evaluating `workflow.patched` at all. Histories recorded before a change was
listed here carry no such input and keep deciding by `workflow.patched`, marker or not,
so they replay unchanged (tests/replay).

Deploy workers before starters: a worker older than a starter refuses an input naming
a change it does not know (the input model forbids unknown fields), and its task
retries until a newer worker takes it.
"""

from __future__ import annotations

from typing import Final

PARKED_STAYS_OPEN: Final = "parked-link-stays-open"
BOUNDED_RUNS: Final = "bounded-runs"
VISIBLE_PATCH_AMBIGUITY: Final = "visible-patch-ambiguity"
REMOTE_BUDGET_PRIORITY: Final = "remote-budget-priority"
# OPS-1: SourceRecordId / RemoteId / ParkReason, and upserts of changed values only.
OPS_ATTRIBUTES: Final = "ops-search-attributes"

BORN_WITH: Final[tuple[str, ...]] = (
    PARKED_STAYS_OPEN,
    BOUNDED_RUNS,
    VISIBLE_PATCH_AMBIGUITY,
    REMOTE_BUDGET_PRIORITY,
    OPS_ATTRIBUTES,
)
