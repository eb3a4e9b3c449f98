"""The attempt-side drift tests' seams (hooks that apply a change between two tries or after
the claim), the pack edits by slot, and what they read back."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from sandbox.server import BackgroundSandbox
from services.dispatch_hooks import DispatchHooks
from tests.e2e.conftest import Stack
from tests.e2e.patch_support import Doc, apply_edit
from tests.e2e.support import eventually

Step = Callable[[], Awaitable[None]]
Edit = Callable[[Doc], None]

CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"
DEALS = "/crm/v3/objects/deals"
CONTACT, COMPANY, DEAL = 0, 1, 2  # index of the action and destination slot in the demo pack


class SeamHooks(DispatchHooks):
    """Runs the next queued step at each try's claim (before its POST) and at each answer
    (before it is applied: the next send is the one after the change)."""

    def __init__(self) -> None:
        self.at_claim: list[Step] = []
        self.at_answer: list[Step] = []
        self.tries = 0

    async def before_checkpoint(self, attempt_id: str) -> None:
        del attempt_id
        self.tries += 1
        if self.at_claim:
            await self.at_claim.pop(0)()

    async def after_answer(self, attempt_id: str) -> None:
        del attempt_id
        if self.at_answer:
            await self.at_answer.pop(0)()


@pytest.fixture
def hooks() -> SeamHooks:
    return SeamHooks()


# -- pack edits, by slot index ---------------------------------------------------------


def slot_profile(doc: Doc, index: int) -> Doc:
    name = doc["destinationSlots"][index]["profile"]
    profile: Doc = next(p for p in doc["profiles"] if p["name"] == name)
    return profile


def destination_removed(index: int) -> Edit:
    """The slot's destination slot is gone; the action slot names a new one (same target)."""

    def edit(doc: Doc) -> None:
        destination = doc["destinationSlots"][index]
        destination["id"] = f"{destination['id']}-v2"
        doc["actionSlots"][index]["destinationSlot"] = destination["id"]

    return edit


def profile_edit(**values: str) -> Callable[[int], Edit]:
    def for_slot(index: int) -> Edit:
        def edit(doc: Doc) -> None:
            slot_profile(doc, index).update(values)

        return edit

    return for_slot


CHANGES = {
    "destination-removed": destination_removed,  # D-08A
    "credential-ref": profile_edit(credentialRef="env:OTHER_TOKEN"),  # D-09A
    "endpoint-class": profile_edit(endpointClass="objects-api-v2"),  # D-10A
    "base-url": profile_edit(baseUrl="http://127.0.0.1:9"),  # D-10A
    "generation": profile_edit(credentialGeneration="2"),  # D-11A, no rotation declared
}
SURFACE = {
    "destination-removed": "profile_replaced",
    "credential-ref": "credential_ref",
    "endpoint-class": "endpoint",
    "base-url": "endpoint",
    "generation": "credential_generation",
}


def applying(stack: Stack, remote: BackgroundSandbox, edit: Edit) -> Step:
    async def step() -> None:
        await apply_edit(stack.pool, remote, edit)

    return step


async def journal_rows(stack: Stack, attempt_id: object) -> int:
    count: int = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_send_journal WHERE attempt_id = $1", attempt_id
    )
    return count


async def parked(stack: Stack, key: str) -> asyncpg.Record:
    return await eventually(
        lambda: stack.attempt(key), lambda r: r["status"] == "ambiguous_remote_effect"
    )


def assert_parked_for(attempt: asyncpg.Record, surface: str, before: str = "POST") -> None:
    """Parked by the send gate before its `before` (a POST, or a locator lookup) for a
    fail-closed finding on `surface`."""
    assert f"drift before {before}" in attempt["last_error"], attempt["last_error"]
    findings = json.loads(attempt["drift_findings"])
    assert {"surface": surface, "disposition": "fail_closed"}.items() <= {
        k: v for f in findings if f["surface"] == surface for k, v in f.items()
    }.items(), findings
