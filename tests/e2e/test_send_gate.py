"""One gate before every send (SPEC §17 G-1, C-2', C-4), end to end on the real stack
(Postgres, Temporal, the sandbox remote over HTTP).

The reproduction: a contact link is finalized on a profile that declares 429 not applied;
its next PATCH is answered 429 with a short Retry-After; during the wait something the
PATCH depends on changes (a new install with the slot's mapping changed, the saver's
field access, the source record, the credential, the endpoint). At the Retry-After the
re-send is put to the same gate as a first try: nothing is sent (the sandbox's ledger
holds no PATCH and its fault counter saw one PATCH request), the PATCH fails, and the
link is as the drift matrix's finalized-link column says. Before the gate the resumed
PATCH decided from its journal alone and went out with the body built before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from protocol.admission import PatchQueued
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.dispatch_hooks import DispatchHooks
from tests.e2e.conftest import Stack, contact_key, deal_key
from tests.e2e.patch_support import (
    Doc,
    apply_edit,
    credential_ref,
    endpoint_class,
    finalized_contact,
    mapping_rows,
    patch_rows,
    patches,
    remote_object,
    set_field,
    settled,
)
from tests.e2e.support import eventually

CONTACT_OBJECTS = "/crm/v3/objects/contacts/*"
DEAL_OBJECTS = "/crm/v3/objects/deals/*"
RETRY_AFTER_S = "2"  # the window in which the change lands; the test waits on conditions

Change = Callable[[Stack, BackgroundSandbox], Awaitable[None]]


async def _patch_journal(stack: Stack, key: str) -> list[asyncpg.Record]:
    return await stack.pool.fetch(
        """
        SELECT j.kind, j.method, j.outcome, j.status FROM connector_send_journal j
        JOIN connector_patch_dispatch p USING (patch_id)
        WHERE p.link_key = $1 ORDER BY j.journal_id
        """,
        key,
    )


async def _refused_429(stack: Stack, remote: BackgroundSandbox, change: Change) -> str:
    """c-001 finalized; its PATCH answered 429 (Retry-After); `change` during the wait.
    Returns the link key once the PATCH is settled."""
    await finalized_contact(stack, "c-001")
    key = contact_key("c-001")
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="PATCH",
            path=CONTACT_OBJECTS,
            action="status",
            status=429,
            retry_after=RETRY_AFTER_S,
            nth=1,
        )
    )
    await set_field(stack.pool, "Contact", "c-001", "FirstName", "Augusta")
    assert isinstance(await stack.push("c-001"), PatchQueued)
    await eventually(
        lambda: _patch_journal(stack, key),
        lambda rows: [(r["outcome"], r["status"]) for r in rows] == [("answered", 429)],
    )
    await change(stack, remote)  # inside the Retry-After window: nothing re-sent yet
    await settled(stack, key)
    return key


async def _assert_nothing_resent(stack: Stack, remote: BackgroundSandbox, key: str) -> None:
    assert await patches(stack) == []  # no PATCH reached the remote object
    [rule] = await stack.sandbox.faults()
    assert rule.matched == 1  # the 429'd try was the only PATCH request the remote saw
    journal = await _patch_journal(stack, key)
    assert [(r["kind"], r["outcome"], r["status"]) for r in journal] == [("send", "answered", 429)]
    link = await stack.link(key)
    assert link is not None
    remote_id = link["remote_id"]
    assert (await remote_object(remote, "contacts", remote_id))["properties"]["firstname"] == (
        "Ada"
    )


async def _failed_patch(stack: Stack, key: str) -> asyncpg.Record:
    [row] = await patch_rows(stack, key)
    assert row["status"] == "failed", dict(row)
    return row


async def _suspended_for(stack: Stack, key: str, reason: str) -> None:
    link = await stack.link(key)
    assert link is not None
    assert (link["status"], link["suspend_reason"]) == ("suspended_drift", reason)


# -- the reproduction and its variants ------------------------------------------------------


async def _new_install_mapping_changed(stack: Stack, remote: BackgroundSandbox) -> None:
    await apply_edit(stack.pool, remote, mapping_rows)


async def test_a_new_install_during_a_429_wait_stops_the_resend(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """Issue 49's reproduction (G-1, C-4, C-2'): `pack apply` of a pack whose mapping for
    the slot changed, during the Retry-After of a 429 the profile declares not applied.
    The re-send is refused at its claim: no PATCH sent, the PATCH `failed`, the link
    `suspended_drift` (`drift:mapping`, the matrix's finalized-link column), revalidation
    its way out. Fails without the gate: the old body went out, applied, `succeeded`."""
    key = await _refused_429(stack, remote, _new_install_mapping_changed)
    await _assert_nothing_resent(stack, remote, key)
    row = await _failed_patch(stack, key)
    assert "drift before PATCH" in row["last_error"] and "mapping" in row["last_error"]
    await _suspended_for(stack, key, "drift:mapping")


async def _field_revoked(stack: Stack, remote: BackgroundSandbox) -> None:
    del remote
    await stack.pool.execute(
        "DELETE FROM crm_field_permission "
        "WHERE user_id = 'alice' AND source_object = 'Contact' AND field_name = 'FirstName'"
    )


async def test_field_access_revoked_during_the_wait_fails_the_resend(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """G-1 (current authority for the fields sent): the saver loses read access to
    FirstName, which the frozen body carries. The re-send fails `field_unreadable`, nothing
    sent; source authority is benign in the finalized-link column, so the link stays
    `finalized` and a later save PATCHes what the saver may read now."""
    key = await _refused_429(stack, remote, _field_revoked)
    await _assert_nothing_resent(stack, remote, key)
    row = await _failed_patch(stack, key)
    assert row["last_error"].startswith("field_unreadable"), row["last_error"]
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"


async def _source_deleted(stack: Stack, remote: BackgroundSandbox) -> None:
    del remote
    await stack.pool.execute(
        "UPDATE crm_record SET deleted = true "
        "WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )


async def test_source_deleted_during_the_wait_fails_the_resend(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """G-1 (the source record exists; PATCH-1): the record is deleted during the wait. The
    re-send fails `source_deleted`, nothing sent; the link stays as it is (the matrix has
    no row for it), its evidence kept."""
    key = await _refused_429(stack, remote, _source_deleted)
    await _assert_nothing_resent(stack, remote, key)
    row = await _failed_patch(stack, key)
    assert row["last_error"].startswith("source_deleted"), row["last_error"]
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"


async def _credential_changed(stack: Stack, remote: BackgroundSandbox) -> None:
    await apply_edit(stack.pool, remote, credential_ref)


async def test_a_credential_change_during_the_wait_suspends_the_link(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """G-1, drift row "credential ref" (fail closed for a finalized link unless rotation is
    declared on both sides): nothing sent, PATCH `failed`, link `drift:credential_ref`."""
    key = await _refused_429(stack, remote, _credential_changed)
    await _assert_nothing_resent(stack, remote, key)
    await _failed_patch(stack, key)
    await _suspended_for(stack, key, "drift:credential_ref")


async def _endpoint_changed(stack: Stack, remote: BackgroundSandbox) -> None:
    await apply_edit(stack.pool, remote, endpoint_class)


async def test_an_endpoint_change_during_the_wait_suspends_the_link(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """G-1, drift row "endpoint class or binding": nothing sent, PATCH `failed`, link
    `drift:endpoint`."""
    key = await _refused_429(stack, remote, _endpoint_changed)
    await _assert_nothing_resent(stack, remote, key)
    await _failed_patch(stack, key)
    await _suspended_for(stack, key, "drift:endpoint")


# -- C-2' ---------------------------------------------------------------------------------


async def test_a_patch_every_try_of_which_was_not_applied_is_resent_through_the_gate(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """C-2' (second sentence): a 429 the profile declares not applied proves the try had no
    effect; with nothing changed the gate lets the same frozen body go again after the
    Retry-After: applied once, `succeeded`, the journal [429, 200], the link finalized.
    (The control for the tests above: the same story with no change re-sends.)"""

    async def nothing(stack: Stack, remote: BackgroundSandbox) -> None:
        del stack, remote

    key = await _refused_429(stack, remote, nothing)
    [row] = await patch_rows(stack, key)
    assert row["status"] == "succeeded"
    assert len(await patches(stack)) == 1
    journal = await _patch_journal(stack, key)
    assert [(r["kind"], r["status"]) for r in journal] == [("send", 429), ("send", 200)]
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"
    properties = (await remote_object(remote, "contacts", link["remote_id"]))["properties"]
    assert properties["firstname"] == "Augusta"


class BeforeReadBack(DispatchHooks):
    """Runs the queued steps before a PATCH's read-back is gated (the window in which its
    answer was awaited)."""

    def __init__(self) -> None:
        self.steps: list[Callable[[], Awaitable[None]]] = []

    async def before_read_back(self, patch_id: str) -> None:
        del patch_id
        if self.steps:
            await self.steps.pop(0)()


@pytest.fixture
def hooks() -> DispatchHooks:
    return BeforeReadBack()


def _deal_credential(doc: Doc) -> None:
    next(p for p in doc["profiles"] if p["name"] == "sandbox-locator")["credentialRef"] = (
        "env:OTHER_TOKEN"
    )


async def test_a_patch_that_may_have_landed_is_never_sent_again_and_its_read_back_is_gated(
    stack: Stack, remote: BackgroundSandbox, hooks: DispatchHooks
) -> None:
    """C-2' (first sentence) and G-1's read-back row: a deal's PATCH (profile with
    `patchReplaySafe`, If-Match and a read-back) lands and its connection drops: the try
    may have landed, so it is never sent again; a read-back GET could prove it applied,
    but the credential changed while the answer was awaited, so the gate refuses the GET
    too: no GET reaches the remote, the PATCH parks `ambiguous_remote_effect`, the link
    `drift:credential_ref`. Fails without the gate: the GET went with the old credential
    and the PATCH ended `succeeded`."""
    assert isinstance(hooks, BeforeReadBack)
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEAL_OBJECTS, action="reset_after_effect", nth=1)
    )
    reads = FaultRuleSpec(method="GET", path=DEAL_OBJECTS, action="delay_ms", delay_ms=0)
    await stack.sandbox.add_fault(reads)  # counts every read of the deal, changes nothing
    hooks.steps = [lambda: apply_edit(stack.pool, remote, _deal_credential)]
    await set_field(stack.pool, "Opportunity", "o-001", "Amount", "4200")
    decision = await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    assert isinstance(decision, PatchQueued)
    rows = await settled(stack, key)
    assert [r["status"] for r in rows] == ["ambiguous_remote_effect"], [dict(r) for r in rows]
    assert "drift before read-back" in rows[0]["last_error"], rows[0]["last_error"]
    assert hooks.steps == []
    assert len(await patches(stack, "deals")) == 1  # landed once, never sent again
    patch_rule, read_rule = await stack.sandbox.faults()
    assert (patch_rule.matched, read_rule.matched) == (1, 0)  # one PATCH, no GET
    journal = await _patch_journal(stack, key)
    assert [(r["kind"], r["method"], r["outcome"]) for r in journal] == [
        ("send", "PATCH", "no_answer")
    ]
    await _suspended_for(stack, key, "drift:credential_ref")


# -- every request has its journal row -------------------------------------------------------


async def test_a_locator_lookup_and_a_read_back_each_write_a_journal_row(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """G-1: a GET is evidence too. A deal's first POST lands and its answer is lost: the
    locator lookup GET finds the object (a `lookup` row, answered 200, beside the POST's
    `send` row); its next PATCH lands and its answer is lost: the read-back GET proves it
    applied (a `readback` row beside the PATCH's). Neither GET counts as a try that may
    have landed: the link is finalized and the PATCH `succeeded`."""
    del remote
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path="/crm/v3/objects/deals", action="reset_after_effect", nth=1
        )
    )
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    tries = await stack.pool.fetch(
        "SELECT kind, method, outcome, status FROM connector_send_journal "
        "WHERE attempt_id = $1 ORDER BY journal_id",
        attempt["attempt_id"],
    )
    assert [tuple(r) for r in tries] == [
        ("send", "POST", "no_answer", None),
        ("lookup", "GET", "answered", 200),
    ]

    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEAL_OBJECTS, action="reset_after_effect", nth=1)
    )
    await set_field(stack.pool, "Opportunity", "o-001", "Amount", "4200")
    decision = await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    assert isinstance(decision, PatchQueued)
    assert [r["status"] for r in await settled(stack, key)] == ["succeeded"]
    journal = await _patch_journal(stack, key)
    assert [tuple(r) for r in journal] == [
        ("send", "PATCH", "no_answer", None),
        ("readback", "GET", "answered", 200),
    ]
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"
