"""Committed workflow histories replay against today's code (STYLE rule 8, SPEC VER-1).

A non-deterministic change to the workflow (a new activity or timer in an
existing path without `workflow.patched`) fails here. The LinkWorkflow histories
are the first release's baseline, recorded by tests/e2e/test_replay_sources.py;
the rule for changes after it is in `workflows/link.py` (theory of operation 5).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from worker.runtime import PASSTHROUGH_MODULES
from workflows.action_callback import ActionCallbackWorkflow
from workflows.inbound import InboundEventWorkflow
from workflows.link import LinkWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_committed() -> None:
    names = {path.stem for path in HISTORIES}
    assert {
        "happy_path_create",  # a clean create: the run completes with no upsert, no timer
        "happy_path_patch",  # the next save's new run: the create step sends the PATCH
        "retire_on_a_closed_link",  # an operator wake holds the run for its update
        "ambiguous_then_reconcile",  # parked open (no timer), reconciled, completes
        "parked_then_reconciled_from_ui_json",  # OPS-1 attributes, lenient update input
        "action_5xx",
        "action_event",
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_deterministically(path: Path) -> None:
    history = WorkflowHistory.from_json(f"replay-{path.stem}", path.read_text())
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
    replayer = Replayer(
        workflows=[LinkWorkflow, InboundEventWorkflow, ActionCallbackWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
