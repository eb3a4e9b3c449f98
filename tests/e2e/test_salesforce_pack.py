"""examples/salesforce.yaml against the sandbox's salesforce mode: what only this remote
family answers (issue 52; SPEC REC-1). The scenarios every pack runs (create, lost
answers, PATCH answered 204 with no body, 400 UNABLE_TO_LOCK_ROW, 403
REQUEST_LIMIT_EXCEEDED and its rolling window, drift) are tests/e2e/test_pack_scenarios.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from temporalio.client import Client

from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from tests.e2e.pack_cases import CASES, PackRun, pack_run
from tests.e2e.pack_cases import salesforce_remote as salesforce_remote  # a fixture
from tests.e2e.support import eventually

(SALESFORCE,) = [c for c in CASES if c.name == "salesforce"]
LOCATOR = "Connector_Push_Locator__c"


@pytest.fixture
async def sf(
    db_pool: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    salesforce_remote: BackgroundSandbox,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[PackRun]:
    async with pack_run(
        SALESFORCE, salesforce_remote, db_pool, temporal_client, task_queue, monkeypatch
    ) as run:
        yield run


async def test_a_locator_answered_300_is_not_unique_and_parks_for_an_operator(
    sf: PackRun,
) -> None:
    """The look-up by the external-id field answers 300 Multiple Choices: no later look-up
    can settle which record is ours, so the link parks; the create is never re-sent."""
    path = SALESFORCE.create_path
    await sf.sandbox.add_fault(FaultRuleSpec(method="POST", path=path, action="reset_after_effect"))
    await sf.sandbox.add_fault(
        FaultRuleSpec(
            method="GET",
            path=f"{path}{LOCATOR}/*",
            action="status",
            status=300,
            body=[f"{path}a", f"{path}b"],
        )
    )
    await sf.push("r-00")
    await eventually(lambda: sf.status("r-00"), lambda s: s == "ambiguous_remote_effect")
    assert len(await sf.objects()) == 1  # created once, never re-sent blind
