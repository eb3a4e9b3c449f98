"""The three endpoints the seed-row ingress tests drive, a live server on them, and a signed
single-event webhook delivery."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.ingress.support import (
    Live,
    encode,
    event,
    live_server,
    make_config,
    signed_headers,
)

RETRY, DROP, ACTIONS = "/webhooks/crm", "/webhooks/crm-drop", "/actions/crm"


@pytest.fixture
async def live(db_dsn: str) -> AsyncIterator[Live]:
    async with live_server(make_config(), db_dsn) as server:
        yield server


def webhook(path: str, n: int) -> tuple[bytes, dict[str, str]]:
    body = encode([event(n)])
    return body, signed_headers(body, path)
