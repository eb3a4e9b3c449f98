"""The same e2e scenarios for every pack (issue 51 "done when", issue 52 item 4): the demo
pack on the generous sandbox, examples/hubspot.yaml on the `hubspot` mode and
examples/salesforce.yaml on the `salesforce` mode (tests/e2e/pack_cases.py). Each remote
answers as its family does; what the runtime does with the answers is the pack's
declarations (SPEC PROF-1, PROF-5, P-01), so the assertions are the same for all three:

- a create is sent once and finalized (WF-2, POST-1..4);
- a create whose answer is lost after the remote applied it is found by the locator, not
  sent again; one lost before it applied anything is proven absent and sent again (REC-1);
- a PATCH reaches the remote (PAT; 204 with no body for Salesforce);
- an answer the pack declares not applied (a 429, a row lock) is sent again, once (PROF-1);
- the remote's spent daily limit makes the budget wait until the reset the pack declares
  (calendar day or rolling 24 hours), not parked, then the same create goes once (PROF-5);
- a mapping change suspends the link and sends no PATCH (DRIFT-2).

Real Postgres, Temporal and each sandbox over HTTP; the worker's quota clock and the
sandbox's are moved instead of waiting a day.

Time budget (docs/testing-and-benchmarks.md): 120 s of wall clock for the module's 21
tests with `-n 2`, the servers' start included (39 s measured on a quiet machine).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from temporalio.client import Client

from protocol.admission import CreateReserved, PatchQueued, Rejected
from protocol.errors import RejectReason
from sandbox.faults import FaultRuleSpec
from services.packs import apply_pack
from tests.e2e.hubspot_support import hubspot_remote as hubspot_remote  # a fixture
from tests.e2e.pack_cases import CASES, PackCase, PackRun, edit_slot, pack_run
from tests.e2e.pack_cases import salesforce_remote as salesforce_remote  # a fixture
from tests.e2e.patch_support import set_field
from tests.e2e.support import eventually


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
async def run(
    request: pytest.FixtureRequest,
    db_pool: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[PackRun]:
    case: PackCase = request.param
    server = request.getfixturevalue(case.server)  # only the sandbox this pack needs
    async with pack_run(case, server, db_pool, temporal_client, task_queue, monkeypatch) as r:
        yield r


async def test_a_create_is_sent_once_and_finalized(run: PackRun) -> None:
    assert isinstance(await run.push("r-00"), CreateReserved)
    remote_id = await run.finalized("r-00")
    creates = await run.sandbox.ledger(run.case.target_object, "create")
    assert [(e.object_id, e.status) for e in creates] == [(remote_id, 201)]
    assert [run.case.object_id(o) for o in await run.objects()] == [remote_id]


async def test_a_lost_answer_after_the_remote_applied_it_is_found_by_the_locator(
    run: PackRun,
) -> None:
    """No idempotency key: the locator look-up finds the object; nothing is sent again."""
    await run.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=run.case.create_path, action="reset_after_effect", times=1
        )
    )
    await run.push("r-00")
    remote_id = await run.finalized("r-00")
    assert await run.journal() == [("no_answer", None), ("answered", 200)]
    creates = await run.sandbox.ledger(run.case.target_object, "create")
    assert [e.object_id for e in creates] == [remote_id]
    (only,) = await run.objects()
    assert run.case.object_id(only) == remote_id


async def test_a_lost_answer_before_the_remote_applied_it_is_proven_absent_and_sent_again(
    run: PackRun,
) -> None:
    await run.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=run.case.create_path, action="reset_before_effect", times=1
        )
    )
    await run.push("r-00")
    remote_id = await run.finalized("r-00")
    # The lost try, the look-up that proved it had no effect (404), the create sent again.
    assert await run.journal() == [("no_answer", None), ("answered", 404), ("answered", 201)]
    assert [run.case.object_id(o) for o in await run.objects()] == [remote_id]


async def test_a_patch_reaches_the_remote(run: PackRun) -> None:
    await run.push("r-00")
    remote_id = await run.finalized("r-00")
    source_field, remote_property = run.case.patched
    await set_field(run.pool, run.case.source_object, "r-00", source_field, "Augusta")
    assert isinstance(await run.push("r-00"), PatchQueued)
    rows = await eventually(
        lambda: run.pool.fetch(
            "SELECT status FROM connector_patch_dispatch WHERE link_key = $1",
            run.case.key("r-00"),
        ),
        lambda rows: bool(rows) and all(r["status"] not in ("pending", "processing") for r in rows),
    )
    assert [r["status"] for r in rows] == ["succeeded"]
    patches = await run.sandbox.ledger(run.case.target_object, "patch")
    assert [(p.object_id, p.status) for p in patches] == [(remote_id, run.case.patch_status)]
    (only,) = await run.objects()
    assert run.case.properties(only)[remote_property] == "Augusta"


async def test_a_refusal_declared_not_applied_is_sent_again_once(run: PackRun) -> None:
    """A 429 (demo, HubSpot) or 400 UNABLE_TO_LOCK_ROW (Salesforce): refused before
    processing, so the same frozen request goes again; one object, no look-up needed."""
    await run.sandbox.add_fault(run.case.refusal)
    await run.push("r-00")
    remote_id = await run.finalized("r-00")
    refused = run.case.refusal.status
    assert await run.journal() == [("answered", refused), ("answered", 201)]
    creates = await run.sandbox.ledger(run.case.target_object, "create")
    assert [e.object_id for e in creates] == [remote_id]


async def test_a_spent_daily_limit_waits_for_the_declared_reset_then_sends_once(
    run: PackRun,
) -> None:
    """The remote's own daily allocation is spent after one request: the refusal (a 429
    naming DAILY, a 403 REQUEST_LIMIT_EXCEEDED) pauses the budget until the reset the pack
    declares, visible on the link and not parked; after it the same create goes once."""
    await run.case.limit(run.sandbox, 1)
    await run.push("r-00")
    await run.finalized("r-00")
    before = run.hooks.now()
    await run.push("r-01")
    view = await eventually(lambda: run.view("r-01"), lambda v: v.quota_wait_until is not None)
    after = run.hooks.now()
    wait_until = view.quota_wait_until
    assert wait_until is not None and not view.needs_operator
    assert run.case.reset_after(before) <= wait_until <= run.case.reset_after(after)
    refusals = await run.pool.fetch(
        "SELECT status FROM connector_send_journal WHERE daily_refusal ORDER BY journal_id"
    )
    assert [r["status"] for r in refusals] == [run.case.daily_status]
    assert await run.status("r-01") == "processing"  # claimed, waiting: not parked

    await run.move_clocks(wait_until + timedelta(seconds=2), requests=1)
    remote_id = await run.finalized("r-01")
    creates = await run.sandbox.ledger(run.case.target_object, "create")
    assert len(creates) == 2 and creates[-1].object_id == remote_id
    assert len(await run.objects()) == 2


async def test_a_mapping_change_suspends_the_link_and_sends_no_patch(run: PackRun) -> None:
    await run.push("r-00")
    await run.finalized("r-00")
    manifest = run.case.manifest(run.server.url)
    edit_slot(manifest, run.case.slot)["mappings"].append(
        {"sourceField": "Title", "remoteProperty": "jobtitle"}
    )
    async with run.pool.acquire() as conn:
        await apply_pack(conn, manifest)
    await set_field(run.pool, run.case.source_object, "r-00", run.case.patched[0], "Changed")
    decision = await run.push("r-00")
    assert isinstance(decision, Rejected) and decision.reason is RejectReason.DRIFT_FAIL_CLOSED
    link = await eventually(
        lambda: run.stack.link(run.case.key("r-00")),
        lambda r: r is not None and r["status"] == "suspended_drift",
    )
    assert link is not None and link["suspend_reason"] == "drift:mapping"
    assert any(f["disposition"] == "fail_closed" for f in json.loads(link["drift_findings"]))
    assert await run.sandbox.ledger(run.case.target_object, "patch") == []
