"""The endpoint plumbing's shortcuts change no bytes and no routing: responses render as
Starlette's JSONResponse does, and endpoint routes still refuse other methods."""

from __future__ import annotations

from decimal import Decimal

import asyncpg
import pytest
from starlette.responses import JSONResponse

from ingress.app import _JSONResponse
from tests.ingress.support import NOTHING_STORED, counts, live_server, make_config


@pytest.mark.parametrize(
    "content",
    [
        {"requestId": "r", "receipts": [{"receiptId": "rc1_x", "eventId": None}]},
        {"error": "bad_signature"},
        {"text": "naïve ✓ ü", "n": 1, "list": [True, False, None]},
    ],
)
def test_json_response_renders_the_same_bytes(content: object) -> None:
    ours = _JSONResponse(content, status_code=202, headers={"Retry-After": "5"})
    theirs = JSONResponse(content, status_code=202, headers={"Retry-After": "5"})
    assert ours.body == theirs.body
    assert ours.raw_headers == theirs.raw_headers


def test_json_response_still_refuses_non_finite_numbers() -> None:
    with pytest.raises(ValueError):
        _JSONResponse({"n": float("nan")})
    with pytest.raises(TypeError):
        _JSONResponse({"n": Decimal(1)})


async def test_endpoint_routes_still_refuse_other_methods(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    async with live_server(make_config(), db_dsn) as live:
        response = await live.client.get("/webhooks/crm")
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"
    assert await counts(db_pool) == NOTHING_STORED
