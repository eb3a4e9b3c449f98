"""The sandbox forgets idempotency keys after its TTL, as a real remote does (SPEC §17 G-5):
a reused key after it creates a second object."""

from __future__ import annotations

import httpx

from sandbox.client import SandboxClient
from sandbox.config import DEFAULT_KEY_TTL_S
from tests.sandbox.support import CONTACTS

ANN = {"properties": {"firstname": "Ann"}}  # no unique value: nothing else refuses a second


async def test_g5_a_key_reused_within_its_ttl_replays_and_after_it_creates_again(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    headers = {"Idempotency-Key": "attempt-ttl"}
    first = await http.post(CONTACTS, json=ANN, headers=headers)
    assert await sandbox.age_idempotency_keys(DEFAULT_KEY_TTL_S - 60) == 1
    within = await http.post(CONTACTS, json=ANN, headers=headers)
    assert within.json()["id"] == first.json()["id"]
    assert within.headers["Idempotent-Replayed"] == "true"

    await sandbox.age_idempotency_keys(120)  # now past the day the sandbox keeps keys
    after = await http.post(CONTACTS, json=ANN, headers=headers)
    assert after.status_code == 201 and after.json()["id"] != first.json()["id"]
    assert len(await sandbox.objects("contacts")) == 2
    # The key is the new object's now, for another TTL.
    again = await http.post(CONTACTS, json=ANN, headers=headers)
    assert again.json()["id"] == after.json()["id"]
    ledger = await sandbox.ledger("contacts", "create")
    assert [e.replayed for e in ledger] == [False, True, False, True]
