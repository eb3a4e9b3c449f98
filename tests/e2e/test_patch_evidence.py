"""Issue 10, problem 2, end to end: our own landed PATCH is not a remote conflict (SPEC
PROF-2, JRN-2): a lost answer is proved applied by read-back, a 412 our own earlier
ambiguous PATCH caused is not a conflict, and a real out-of-band change still suspends.

Real Postgres, a real Temporal server and the sandbox over HTTP.
"""

from __future__ import annotations

import asyncpg
import httpx
import pytest
from temporalio.client import WorkflowUpdateFailedError

from db import journal as jq
from protocol.admission import PatchQueued
from protocol.messages import (
    RevalidateInput,
)
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from tests.e2e.conftest import Stack, deal_key, demo_manifest
from tests.e2e.evidence_support import refusal_chain, status_of
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow

DEALS = "/crm/v3/objects/deals/*"


# -- problem 2: our own landed PATCH is not a remote conflict -----------------------------


async def _finalized_deal(stack: Stack) -> asyncpg.Record:
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    await status_of(stack, key, "finalized")
    link = await stack.link(key)
    assert link is not None and link["remote_etag"]
    return link


async def _save_deal_amount(stack: Stack, amount: str) -> None:
    await stack.pool.execute(
        "UPDATE crm_record SET fields = fields || jsonb_build_object('Amount', $1::text) "
        "WHERE source_object = 'Opportunity' AND record_id = 'o-001'",
        amount,
    )
    decision = await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    assert isinstance(decision, PatchQueued)


async def _patches(stack: Stack, key: str) -> list[asyncpg.Record]:
    return await stack.pool.fetch(
        "SELECT * FROM connector_patch_dispatch WHERE link_key = $1 ORDER BY created_at", key
    )


async def _settled(stack: Stack, key: str, count: int) -> list[asyncpg.Record]:
    def done(rows: list[asyncpg.Record]) -> bool:
        finished = [r for r in rows if r["status"] not in ("pending", "processing")]
        return len(finished) >= count

    return await eventually(lambda: _patches(stack, key), done, timeout_s=60)


async def test_a_landed_patch_whose_answer_is_lost_is_proved_applied_by_read_back(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """P-50, SPEC §15 C-2: patchReplaySafe + If-Match + readback. The PATCH lands, its
    answer is lost. Before, it was re-sent (with the stale ETag, answered 412, then read
    back). Now it is never sent again: a GET reads the object back, finds our values:
    applied, new ETag stored, no suspension, one PATCH in the ledger; the next save
    PATCHes cleanly."""
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="hang_after_effect", nth=1)
    )
    await _save_deal_amount(stack, "100")
    [patch] = await _settled(stack, key, 1)
    assert patch["status"] == "succeeded"
    current = await stack.link(key)
    assert current is not None and current["status"] == "finalized"
    async with httpx.AsyncClient(base_url=remote.url) as http:
        read = await http.get(f"/crm/v3/objects/deals/{link['remote_id']}")
    assert current["remote_etag"] == read.headers["etag"] != link["remote_etag"]
    async with stack.pool.acquire() as conn:
        tries = await jq.patch_journal(conn, patch["patch_id"])
    assert [(r["outcome"], r["status"]) for r in tries] == [("no_answer", None)]
    assert len(await stack.sandbox.ledger(object_type="deals", kind="patch")) == 1

    await _save_deal_amount(stack, "200")
    rows = await _settled(stack, key, 2)
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]
    patches = await stack.sandbox.ledger(object_type="deals", kind="patch")
    assert [p.status for p in patches][-1] == 200


async def test_a_real_out_of_band_change_still_suspends_and_revalidate_refreshes_the_etag(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """The same lost answer, but someone changed the object before our read-back: it
    differs, so the PATCH ends ambiguous (never re-sent, C-2) and the link stays
    finalized. The next save's PATCH carries the stale ETag, gets 412, and the read-back
    shows neither its body nor the ambiguous one: the link is suspended
    `remote_conflict`. `revalidate` then reads the ETag back and the next save PATCHes
    without another 412."""
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="hang_after_effect", nth=1)
    )
    await _save_deal_amount(stack, "100")
    await eventually(
        lambda: stack.sandbox.ledger(object_type="deals", kind="patch"), lambda p: len(p) == 1
    )
    async with httpx.AsyncClient(base_url=remote.url) as http:
        await http.patch(
            f"/crm/v3/objects/deals/{link['remote_id']}",
            json={"properties": {"amount": "999"}},
        )
    [first] = await _settled(stack, key, 1)
    assert first["status"] == "ambiguous_remote_effect"
    assert "read-back differs" in first["last_error"]
    assert len(await stack.sandbox.ledger(object_type="deals", kind="patch")) == 2  # ours + theirs
    await _save_deal_amount(stack, "150")
    suspended = await eventually(
        lambda: stack.link(key), lambda r: r is not None and r["status"] == "suspended_drift", 60
    )
    assert suspended is not None and suspended["suspend_reason"] == "remote_conflict"

    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    result = await handle.execute_update(
        LinkWorkflow.revalidate, RevalidateInput(operator="ops", reason="their change is right")
    )
    assert "entity tag" in result.message
    async with httpx.AsyncClient(base_url=remote.url) as http:
        read = await http.get(f"/crm/v3/objects/deals/{link['remote_id']}")
    refreshed = await stack.link(key)
    assert refreshed is not None and refreshed["remote_etag"] == read.headers["etag"]
    await _save_deal_amount(stack, "300")
    rows = await _settled(stack, key, 3)
    assert [r["status"] for r in rows] == ["ambiguous_remote_effect", "failed", "succeeded"]


async def test_revalidate_is_refused_for_a_deleted_remote_object(stack: Stack) -> None:
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="status", status=404)
    )
    await _save_deal_amount(stack, "5")
    suspended = await eventually(
        lambda: stack.link(key), lambda r: r is not None and r["status"] == "suspended_drift"
    )
    assert suspended is not None and suspended["suspend_reason"] == "remote_deleted"
    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            LinkWorkflow.revalidate, RevalidateInput(operator="ops", reason="try anyway")
        )
    assert "retire" in refusal_chain(refused.value)
    row = await stack.link(key)
    assert row is not None and row["status"] == "suspended_drift"


async def test_a_412_caused_by_our_own_earlier_ambiguous_patch_is_not_a_conflict(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """Found by `make chaos`: a PATCH that may have landed ends ambiguous (its read-back
    was inconclusive: the GET answered 503), so the stored ETag is stale; the next save's
    PATCH gets 412. The read-back shows the earlier PATCH's values: the tag moved because
    of us, so it is stored and the new PATCH is sent again (200; its 412 proved it had no
    effect), instead of suspending `remote_conflict`."""
    document = demo_manifest(remote.url)
    for profile in document["profiles"]:  # type: ignore[union-attr]
        if profile["name"] == "sandbox-locator":
            profile["idempotency"] = {"patchReplaySafe": False}
    async with stack.pool.acquire() as conn:
        await apply_pack(conn, document)
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="hang_after_effect", nth=1)
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="GET", path=DEALS, action="status", status=503, nth=1)
    )
    await _save_deal_amount(stack, "100")
    [first] = await _settled(stack, key, 1)
    assert first["status"] == "ambiguous_remote_effect"
    assert "read-back inconclusive" in first["last_error"]
    await _save_deal_amount(stack, "200")
    rows = await _settled(stack, key, 2)
    assert [r["status"] for r in rows] == ["ambiguous_remote_effect", "succeeded"]
    current = await stack.link(key)
    assert current is not None and current["status"] == "finalized"
    async with httpx.AsyncClient(base_url=remote.url) as http:
        obj = (await http.get(f"/crm/v3/objects/deals/{link['remote_id']}")).json()
    assert obj["properties"]["amount"] == "200"
    statuses = [p.status for p in await stack.sandbox.ledger(object_type="deals", kind="patch")]
    assert statuses[-1] == 200
