"""Committed workflow histories replay against today's code (STYLE rule 8, SPEC VER-1).

A non-deterministic change to the workflow (a new activity or timer in an
existing path without `workflow.patched`) fails here. The histories at the top of
histories/ are the 1.0 release's baseline, recorded by tests/e2e/test_replay_sources.py
from the released code; histories/pre-1.0/ keeps the ones recorded before it (runs a
pre-release worker started). The rule for changes after the release is in
`workflows/link.py` (theory of operation 5).
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

ROOT = Path(__file__).parent / "histories"
# The 1.0 baseline (top level) and the kept histories of the runs before it (pre-1.0/):
# a run started before the release still replays.
HISTORIES = sorted(ROOT.rglob("*.json"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT).with_suffix(""))


def test_histories_are_committed() -> None:
    kept = {path.stem for path in (ROOT / "pre-1.0").glob("*.json")}
    assert {"happy_path_create", "happy_path_patch", "retire_on_a_closed_link"} <= kept
    names = {path.stem for path in ROOT.glob("*.json")}
    assert {
        "happy_path_create",  # a clean create: the run completes with no upsert, no timer
        "happy_path_patch",  # the next save's new run: the create step sends the PATCH
        "retire_on_a_closed_link",  # an operator wake holds the run for its update
        "ambiguous_then_reconcile",  # parked open (no timer), reconciled, completes
        "parked_then_reconciled_from_ui_json",  # OPS-1 attributes, lenient update input
        "action_5xx",
        "action_event",
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[_name(p) for p in HISTORIES])
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
