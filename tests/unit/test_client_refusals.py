"""The client refuses before sending what the server would answer with a 400 (SPEC API-1).

Each value here is refused by `connector_push_client`'s models and, with the same field
and message, by the service's own (`protocol.save_api`, whose identity rule is
`protocol.identity`'s, and the ingress's idempotency-key check), and each accepted value
is taken by both: the client and the server cannot drift apart.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.requests import Request

import connector_push_client.models as client
import protocol.save_api as server
from connector_push_client import MAX_BATCH, SaveApiClient
from connector_push_client.models import check_idempotency_key
from ingress.saves import _BadRequest, _claim, parse_batch
from tests.examples import examples

SAVE: dict[str, Any] = {
    "ownerKey": "demo-owner",
    "actionSlot": "push-contact",
    "destinationSlot": "remote-contacts",
    "sourceObject": "Contact",
    "recordId": "c-001",
    "userId": "alice",
    "saveId": "save-1",
}
FIELDS = tuple(SAVE)
OPTIONAL = ("userId", "saveId")

REFUSED_PARTS = {
    "empty": "",
    "leading space": " c-001",
    "trailing space": "c-001 ",
    "leading tab": "\tc-001",
    "trailing newline": "c-001\n",
    "no-break space": "\u00a0c-001",
    "ideographic space": "c-001\u3000",
    "file separator, whitespace to str.strip": "\x1cc-001",
    "NUL inside": "c-\x00001",
    "escape inside": "c-\x1b001",
    "DEL inside": "c-\x7f001",
    "C1 control inside": "c-\x85001",
    "lone surrogate": "c-\ud800001",
    "257 characters": "c" * 257,
    "a number": 1,
    "a list": ["c-001"],
}
ACCEPTED_PARTS = ("c-001", "c 001", "Ünïcødé", "c" * 256, "c\u200b001", "😀")


def _problems(model: type[client.SaveIn], body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The (location, message) of each refusal; empty when `model` takes `body`."""
    try:
        model.model_validate(body)
    except ValidationError as refused:
        return [(e["loc"], e["msg"]) for e in refused.errors()]
    return []


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", REFUSED_PARTS.values(), ids=REFUSED_PARTS)
def test_a_part_the_server_refuses_is_refused_by_the_client_the_same_way(
    field: str, value: object
) -> None:
    body = {**SAVE, field: value}
    refused = _problems(client.SaveIn, body)
    assert refused and all(loc == (field,) for loc, _ in refused)
    assert refused == _problems(server.SaveIn, body)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", ACCEPTED_PARTS)
def test_a_part_the_server_takes_is_taken_by_the_client(field: str, value: str) -> None:
    body = {**SAVE, field: value}
    assert _problems(client.SaveIn, body) == _problems(server.SaveIn, body) == []
    sent = client.SaveIn.model_validate(body).model_dump_json(by_alias=True, exclude_none=True)
    assert server.SaveIn.model_validate_json(sent) == server.SaveIn.model_validate(body)


@pytest.mark.parametrize("field", FIELDS)
def test_only_the_user_and_save_ids_may_be_left_out(field: str) -> None:
    for body in ({**SAVE, field: None}, {k: v for k, v in SAVE.items() if k != field}):
        refused = _problems(client.SaveIn, body)
        assert refused == _problems(server.SaveIn, body)
        assert not refused if field in OPTIONAL else refused


@settings(max_examples=examples(400))
@given(st.text(st.characters(exclude_categories=()), max_size=260))
def test_any_text_as_an_id_is_refused_by_both_or_by_neither(value: str) -> None:
    body = {**SAVE, "recordId": value, "userId": value}
    assert _problems(client.SaveIn, body) == _problems(server.SaveIn, body)


def test_a_batch_holds_one_to_the_most_any_servers_policy_allows() -> None:
    saves = [SAVE] * (MAX_BATCH + 1)
    for refused in ([], saves):
        with pytest.raises(ValidationError):
            client.SaveBatchIn.model_validate({"saves": refused})
    client.SaveBatchIn.model_validate({"saves": saves[:MAX_BATCH]})
    with pytest.raises(ValidationError):
        server.SaveBatchIn.model_validate({"saves": []})
    with pytest.raises(ValidationError):
        server.SaveApiPolicy.model_validate({"clients": [], "max_batch": MAX_BATCH + 1})
    policy = server.SaveApiPolicy.model_validate(
        {
            "clients": [{"name": "crm", "key_env": "CRM_KEY", "owners": ["o"]}],
            "max_batch": MAX_BATCH,
        }
    )
    with pytest.raises(_BadRequest):
        parse_batch(json.dumps({"saves": saves}).encode(), policy)


REFUSED_KEYS = {
    "empty": "",
    "256 characters": "k" * 256,
    "not ASCII": "clé-1",
    "a tab": "crm\t1",
    "NUL": "crm\x001",
    "DEL": "crm\x7f1",
}
# Refused by the client only: HTTP drops the surrounding whitespace, so the server would
# get another key than the one given (or, for spaces alone, none).
REFUSED_KEYS_PADDED = {"leading space": " crm-1", "trailing space": "crm-1 ", "spaces": "  "}
ACCEPTED_KEYS = ("crm-req-1", "k", "k" * 255, "crm req 1", "~!@#$%^&*()")


def _server_claims(key: str) -> bool:
    scope = {"type": "http", "headers": [(b"idempotency-key", key.encode())]}
    try:
        _claim(Request(scope), "crm", "digest")
    except _BadRequest:
        return False
    return True


@pytest.mark.parametrize("key", REFUSED_KEYS.values(), ids=REFUSED_KEYS)
def test_an_idempotency_key_the_server_refuses_is_refused_by_the_client(key: str) -> None:
    with pytest.raises(ValidationError):
        check_idempotency_key(key)
    assert not _server_claims(key)


@pytest.mark.parametrize("key", REFUSED_KEYS_PADDED.values(), ids=REFUSED_KEYS_PADDED)
def test_an_idempotency_key_http_would_change_is_refused_by_the_client(key: str) -> None:
    with pytest.raises(ValidationError):
        check_idempotency_key(key)


@pytest.mark.parametrize("key", ACCEPTED_KEYS)
def test_an_idempotency_key_the_server_takes_is_taken_by_the_client(key: str) -> None:
    assert check_idempotency_key(key) == key
    assert _server_claims(key)


async def test_the_client_sends_nothing_the_server_would_refuse() -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    transport = httpx.MockTransport(answer)
    save = client.SaveIn.model_validate(SAVE)
    async with (
        httpx.AsyncClient(base_url="http://api", transport=transport) as http,
        SaveApiClient("http://api", "key", http=http) as api,
    ):
        with pytest.raises(ValidationError):
            await api.save(save, idempotency_key=" crm-1")
        with pytest.raises(ValidationError):
            await api.save_batch([save] * (MAX_BATCH + 1))
        with pytest.raises(ValidationError):
            await anext(api.save_all([save], idempotency_prefix="k" * 254))
        with pytest.raises(ValueError, match="batch_size"):
            await anext(api.save_all([save], batch_size=MAX_BATCH + 1))
    assert sent == []
