"""The operator's console (issue 14 items 1, 2, 5; SPEC OPS-1, WF-3, WF-4): a parked create
is found by what a support request names, shows why and what to do, and is repaired with
the JSON an operator pastes into the UI, refusals arriving as one line with no trace."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from typer.testing import CliRunner

from cli.main import app
from sandbox.faults import FaultRuleSpec
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.support import eventually
from workflows import search_attributes as sa

SUMMARY = "Account a-002 → remote-companies via push-company (demo-owner)"


async def _parked_company(stack: Stack) -> tuple[str, str]:
    """a-002's create is sent, its answer lost: parked ambiguous; the remote's id."""
    await stack.push("c-002")  # a-002's primary contact, created first
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/companies", action="reset_after_effect")
    )
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    key = company_key("a-002")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "ambiguous_remote_effect")
    [created] = await stack.sandbox.ledger(object_type="companies", kind="create")
    assert created.object_id is not None
    return key, created.object_id


async def _attributes(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    described = await handle.describe()
    return {key.name: described.typed_search_attributes.get(key) for key in sa.ALL}


async def _details(handle: WorkflowHandle[Any, Any]) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


def _cli(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _cli_lines(*args: str) -> list[Any]:
    """A listing's `--json`: JSON Lines, one row a line (issue 34 item 4)."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


async def _refusal(handle: WorkflowHandle[Any, Any], name: str, data: object) -> ApplicationError:
    """Send update `name` with `data` as the UI does (by name, JSON as typed)."""
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(name, data, id=f"ui-{name}-{json.dumps(data)}")
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.failure is not None and cause.failure.stack_trace == ""  # no trace, no paths
    assert cause.cause is None
    return cause


async def test_parked_create_is_found_explained_and_repaired_from_json(
    stack: Stack, db_dsn: str
) -> None:
    key, remote_id = await _parked_company(stack)
    handle = stack.handle(key)
    # OPS-1: the list and the header name record, destination and action.
    assert await (await handle.describe()).static_summary() == SUMMARY
    attrs = await eventually(lambda: _attributes(handle), lambda a: a["ParkReason"] is not None)
    assert attrs["SourceRecordId"] == "a-002"
    assert attrs["ParkReason"] == "ambiguous_remote_effect"
    assert attrs["NeedsOperator"] is True
    query = 'SourceRecordId = "a-002" AND ParkReason = "ambiguous_remote_effect"'

    async def listed() -> list[str]:
        return [w.id async for w in stack.client.list_workflows(query)]

    await eventually(listed, lambda ids: handle.id in ids)
    # The details say what to do, and give the update and the JSON to paste.
    details = await eventually(lambda: _details(handle), lambda d: "reconcile" in d)
    assert "Send an Update" in details and '"remote_id": "<remote_id>"' in details

    # Found from Postgres by what the support request names.
    found = await asyncio.to_thread(
        _cli_lines, "links", "find", "--record-id", "a-002", "--json", "--database-url", db_dsn
    )
    assert [(f["link_key"], f["summary"], f["park_reason"]) for f in found] == [
        (key, SUMMARY, "ambiguous_remote_effect")
    ]
    parked = await asyncio.to_thread(
        _cli_lines, "links", "find", "--park-reason", "ambiguous_remote_effect", "--json",
        "--database-url", db_dsn,
    )  # fmt: skip
    assert [f["link_key"] for f in parked] == [key]
    # One view of the key with no link yet: the attempt, its frozen request, its journal.
    shown = await asyncio.to_thread(_cli, "links", "show", key, "--json", "--database-url", db_dsn)
    assert shown["link"] is None and shown["park_reason"] == "ambiguous_remote_effect"
    [attempt] = shown["attempts"]
    assert (attempt["status"], attempt["request_method"]) == ("ambiguous_remote_effect", "POST")
    assert attempt["request_path"] == "/crm/v3/objects/companies"
    assert [t["may_have_landed"] for t in attempt["send_journal"]] == [True]

    # Bad input and refusals: one readable line, every missing field named.
    bad = await _refusal(handle, "reconcile", {"operator": "ops"})
    assert bad.type == "InvalidUpdateInput"
    for field in ("reason", "remote_id", "evidence"):
        assert f"missing field {field!r}" in bad.message
    typo = await _refusal(handle, "reconcile", {"operator": "ops", "reason": "r", "remoteid": "x"})
    assert "unknown field 'remoteid'" in typo.message
    wrong = await _refusal(handle, "retire", {"operator": "ops", "reason": "tidy"})
    assert wrong.type == "OperatorRefused"
    # One line: the refusal, then what would work (the CLI fills in KEY).
    assert wrong.message.startswith("retire does not apply: the link is none: ")
    assert "\n" not in wrong.message

    # The JSON from the template, filled in, repairs it (as the UI's Data box sends it).
    fixed = {"operator": "ops", "reason": "found it", "remote_id": remote_id, "evidence": "ledger"}
    await handle.execute_update("reconcile", fixed, id="ui-reconcile")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    attrs = await eventually(lambda: _attributes(handle), lambda a: a["ParkReason"] is None)
    assert (attrs["RemoteId"], attrs["NeedsOperator"]) == (remote_id, False)
    by_remote = await asyncio.to_thread(
        _cli_lines, "links", "find", "--remote-id", remote_id, "--json", "--database-url", db_dsn
    )
    assert [(f["link_key"], f["link_status"]) for f in by_remote] == [(key, "finalized")]
    shown = await asyncio.to_thread(_cli, "links", "show", key, "--json", "--database-url", db_dsn)
    assert shown["link"]["remote_id"] == remote_id
    actions = [(a["command"], a["operator"], a["attempt_after"]) for a in shown["operator_actions"]]
    assert actions == [("reconcile", "ops", "finalized")]  # from the audit trail (OPS-2)


async def test_static_attributes_arrive_with_the_start_and_are_never_upserted(
    stack: Stack,
) -> None:
    key = contact_key("c-001")
    await stack.push("c-001")
    handle = stack.handle(key)
    await eventually(handle.describe, lambda d: d.status == WorkflowExecutionStatus.COMPLETED)
    assert (await stack.attempt(key))["status"] == "finalized"
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    static = {"LinkKey", "ConnectorOwnerKey", "DestinationSlotId", "SourceObject", "SourceRecordId"}
    assert static <= set(started.search_attributes.indexed_fields)
    upserted = [
        set(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    # A clean create's run closes without upserting its state (a billed action; Postgres
    # answers `links find`): `workflows/link.py`, theory of operation 4 (issue 32).
    assert upserted == [], upserted
    assert await (await handle.describe()).static_summary() == (
        "Contact c-001 → remote-contacts via push-contact (demo-owner)"
    )
