"""NF-5: what the database cannot store is a 400 at parse time with a reason, nothing
written, on the webhook and the action path alike (protocol/storable.py decides)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from protocol.event_identity import IdentityError, business_identity, parse_exact_json
from protocol.ingress_policy import LegacyIdentityRule
from protocol.storable import MAX_DEPTH, Unstorable, unstorable_reason
from tests.ingress.support import (
    ACTION_SECRET,
    NOTHING_STORED,
    counts,
    encode,
    event,
    execution,
    live_server,
    make_config,
    signed_headers,
)

WEBHOOK = "/webhooks/crm"
ACTION = "/actions/crm"
SURROGATE = "\ud800"  # json.dumps writes it as the 6-character escape \ud800


def _ascii(document: object) -> bytes:
    return json.dumps(document).encode("ascii")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (r'{"a": "\ud800"}', Unstorable.UNENCODABLE_STRING),
        (r'{"\udfff": 1}', Unstorable.UNENCODABLE_STRING),
        (r'[{"a": ["x", "\u0000"]}]', Unstorable.NUL_IN_TEXT),
        ('{"n": 1e1001}', Unstorable.NUMBER_OUT_OF_RANGE),
        ('{"n": 1e-1001}', Unstorable.NUMBER_OUT_OF_RANGE),
        ('{"n": ' + "9" * 1001 + "}", Unstorable.NUMBER_OUT_OF_RANGE),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), Unstorable.NESTING_TOO_DEEP),
        (r'{"emoji": "\ud83d\ude00", "n": 1e1000, "t": "caf\u00e9"}', None),
        ("[" * MAX_DEPTH + "]" * MAX_DEPTH, None),
    ],
)
def test_unstorable_reason(text: str, reason: Unstorable | None) -> None:
    assert unstorable_reason(parse_exact_json(text.encode())) is reason


def test_an_unencodable_identity_part_is_an_identity_error() -> None:
    rule = LegacyIdentityRule(path="callbackId")
    with pytest.raises(IdentityError):
        business_identity(rule, "actions", {"callbackId": SURROGATE})


def _webhook_case(**fields: Any) -> tuple[str, bytes]:
    return WEBHOOK, _ascii([event(1), event(2, **fields)])


def _action_case(**fields: Any) -> tuple[str, bytes]:
    document = execution()
    document.update(fields)
    return ACTION, _ascii(document)


CASES = {
    "surrogate in an identity field": (
        _webhook_case(subscriptionType=SURROGATE),
        "unencodable_string",
    ),
    "surrogate elsewhere": (_webhook_case(changeSource="x" + SURROGATE), "unencodable_string"),
    "NUL in the event type": (
        _webhook_case(subscriptionType="contact.deletion\x00"),
        "nul_in_text",
    ),
    "huge exponent in the identity": (
        (WEBHOOK, encode([event(1)]).replace(b'"eventId": 1', b'"eventId": 1e999999999')),
        "number_out_of_range",
    ),
    "surrogate in inputFields": (_action_case(inputFields={"k": SURROGATE}), "unencodable_string"),
    "surrogate in callbackId": (_action_case(callbackId=SURROGATE), "unencodable_string"),
    "NUL in callbackId": (_action_case(callbackId="cb\x00"), "nul_in_text"),
    "huge action id": (
        (
            ACTION,
            encode(execution()).replace(
                b'"actionDefinitionId": 22', b'"actionDefinitionId": 1e99999999'
            ),
        ),
        "number_out_of_range",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_unstorable_requests_are_400_nothing_written_connection_kept(
    db_dsn: str, db_pool: asyncpg.Pool, case: tuple[tuple[str, bytes], str]
) -> None:
    (path, body), reason = case
    secret = ACTION_SECRET if path == ACTION else None
    extra = {"secret": secret} if secret else {}
    async with live_server(make_config(), db_dsn) as live:
        for _ in range(3):  # the same answer on every retry, never a 503 to retry forever
            response = await live.client.post(
                path, content=body, headers=signed_headers(body, path, **extra)
            )
            assert (response.status_code, response.json()) == (400, {"error": reason})
        assert await counts(db_pool) == NOTHING_STORED
        # The keep-alive connection survived: the next good request on it is admitted.
        good = encode([event(7)])
        after = await live.client.post(WEBHOOK, content=good, headers=signed_headers(good, WEBHOOK))
        assert after.status_code == 202


async def test_a_bare_object_is_not_a_batch(db_dsn: str, db_pool: asyncpg.Pool) -> None:
    body = encode(event(1))
    async with live_server(make_config(), db_dsn) as live:
        response = await live.client.post(
            WEBHOOK, content=body, headers=signed_headers(body, WEBHOOK)
        )
    assert (response.status_code, response.json()) == (400, {"error": "batch_not_array"})
    assert await counts(db_pool) == NOTHING_STORED
