"""Waking a link's workflow: signal-with-start `record_saved` (SPEC WF-1, WF-2).

Shared by the CRM entry (`worker.crm`), the save API and the relay activity. Services
may not import workflow classes (layer contract), so the workflow type and signal are
named here once; the relay and every create-path test start workflows through
this function, so a renamed workflow fails them.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.common import Priority, WorkflowIDConflictPolicy

from db import link_search
from db.records import Conn
from protocol.identity import LINK_WORKFLOW_TYPE, link_workflow_id
from protocol.messages import LinkWorkflowInput, RecordSaved
from protocol.rate_limit import RemoteBudgetResult, remote_priority_key
from protocol.summary import LinkFacts, link_details, link_summary
from workflows.search_attributes import start_attributes

RECORD_SAVED_SIGNAL: Final = "record_saved"


async def wake_link(
    client: Client,
    task_queue: str,
    link_key: str,
    save_id: str | None,
    budget: RemoteBudgetResult | None = None,
    facts: LinkFacts | None = None,
    *,
    for_operator: bool = False,
    bulk: bool = False,
) -> None:
    """Signal-with-start `record_saved`: the signal only says "look for work"; a running
    workflow gets a signal, a closed one is started fresh and reloads from Postgres
    (paced by `budget` when the caller knows it, PROF-3; summarised and searchable by
    `facts`, OPS-1). `for_operator`: an operator update follows, so a run that would
    end when its drain finds no work (WF-1') waits for it a bounded time. `bulk`: a bulk
    `push` admitted the save, so its remote steps yield to single saves (NF-8)."""
    await signal_with_start(
        client,
        task_queue,
        LinkWorkflowInput(link_key=link_key, budget=budget),
        RECORD_SAVED_SIGNAL,
        RecordSaved(save_id=save_id, for_operator=for_operator, bulk=bulk),
        facts,
        # NF-8: a run a bulk push starts has its workflow tasks after single saves' too
        # (its remote activities set their own priority, `workflows.link`).
        Priority(priority_key=remote_priority_key(bulk)),
    )


async def signal_with_start(
    client: Client,
    task_queue: str,
    input: LinkWorkflowInput,
    signal: str,
    arg: BaseModel,
    facts: LinkFacts | None,
    priority: Priority | None = None,
) -> None:
    """Every start of a LinkWorkflow: its id (WF-1), summary and static attributes (OPS-1)."""
    await client.start_workflow(
        LINK_WORKFLOW_TYPE,
        input,
        id=link_workflow_id(input.link_key),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=signal,
        start_signal_args=[arg],
        static_summary=link_summary(facts, input.link_key),
        static_details=link_details(facts, input.link_key),
        search_attributes=start_attributes(input.link_key, facts),
        priority=priority or Priority.default,
    )


async def link_facts(conn: Conn, keys: list[str]) -> dict[str, LinkFacts]:
    """Each key's facts (from its rows), for the runs a starter may start (OPS-1)."""
    rows = await link_search.link_facts(conn, keys)
    return {r["link_key"]: LinkFacts.model_validate(dict(r)) for r in rows}
