"""Waking a link's workflow: signal-with-start `record_saved` (SPEC WF-1, WF-2).

Shared by the CRM entry (`worker.crm`) and the relay activity. Activities may not
import workflow classes (layer contract), so the workflow type and signal are
named here once; the relay and every create-path test start workflows through
this function, so a renamed workflow fails them.
"""

from __future__ import annotations

from typing import Final

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from protocol.identity import LINK_WORKFLOW_TYPE, link_workflow_id
from protocol.messages import LinkWorkflowInput, RecordSaved
from protocol.rate_limit import RemoteBudgetResult

RECORD_SAVED_SIGNAL: Final = "record_saved"


async def wake_link(
    client: Client,
    task_queue: str,
    link_key: str,
    save_id: str | None,
    budget: RemoteBudgetResult | None = None,
) -> None:
    """Signal-with-start `record_saved`: the signal only says "look for work"; a running
    workflow gets a signal, a closed one is started fresh and reloads from Postgres
    (paced by `budget` when the caller knows it, PROF-3)."""
    await client.start_workflow(
        LINK_WORKFLOW_TYPE,
        LinkWorkflowInput(link_key=link_key, budget=budget),
        id=link_workflow_id(link_key),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=RECORD_SAVED_SIGNAL,
        start_signal_args=[RecordSaved(save_id=save_id)],
        static_summary=f"link {link_key}",
    )
