"""Fuzz (hypothesis) over headers and bodies: no 5xx at all while the database is up,
and nothing written on any rejection (ING-1, ING-3, NF-2)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingress.app import create_app, wall_clock_ms
from tests.ingress.support import (
    ACTION_SECRET,
    WEBHOOK_SECRET,
    encode,
    event,
    execution,
    make_config,
    signed_headers,
)

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=20), st.floats(allow_nan=False)
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(["eventId", "objectId", "subscriptionType", "attemptNumber", "appId"])


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    choice = draw(st.integers(0, 4))
    if choice == 4:  # well-formed, so acceptance is reached too
        return encode([event(draw(st.integers(0, 5)), attempt=draw(st.integers(0, 3)))])
    if choice == 0:
        return draw(st.binary(max_size=300))
    if choice == 1:
        return encode(draw(JSON))
    document: Any = [event(draw(st.integers(0, 5)))] if choice == 2 else execution()
    target = document[0] if isinstance(document, list) else document
    target[draw(FIELDS)] = draw(JSON)
    return json.dumps(document).encode()


HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    path = draw(st.sampled_from(["/webhooks/crm", "/webhooks/crm-drop", "/actions/crm"]))
    body = draw(bodies())
    secret = ACTION_SECRET if path == "/actions/crm" else WEBHOOK_SECRET
    headers = signed_headers(body, path, secret=secret) if draw(st.booleans()) else {}
    for name in draw(
        st.lists(
            st.sampled_from(
                ["x-hubspot-signature-v3", "x-hubspot-request-timestamp", "content-type"]
            ),
            max_size=2,
        )
    ):
        headers[name] = draw(HEADER_TEXT)
    if draw(st.booleans()):
        headers["x-hubspot-request-timestamp"] = str(
            wall_clock_ms() + draw(st.integers(-(10**9), 10**9))
        )
    return path, body, headers


async def _pool(dsn: str) -> asyncpg.Pool:
    return await asyncpg.create_pool(dsn, min_size=1, max_size=2)


async def _stored(pool: asyncpg.Pool) -> tuple[int, int, int]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM ingress_receipt), (SELECT count(*) FROM connector_event),"
            " (SELECT count(*) FROM workflow_action_execution)"
        )
    assert row is not None
    return (row[0], row[1], row[2])


def test_fuzzed_requests_never_5xx_and_rejections_write_nothing(db_dsn: str) -> None:
    app = create_app(make_config(), db_dsn)
    with asyncio.Runner() as runner:
        lifespan = app.router.lifespan_context(app)
        runner.run(lifespan.__aenter__())
        pool = runner.run(_pool(db_dsn))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        statuses: set[int] = set()

        # derandomize: the same examples every run, so the coverage check below cannot flake.
        @settings(
            max_examples=200,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        @given(requests())
        def check(request: tuple[str, bytes, dict[str, str]]) -> None:
            path, body, headers = request
            before = runner.run(_stored(pool))
            response = runner.run(client.post(path, content=body, headers=headers))
            statuses.add(response.status_code)
            assert response.status_code < 500, (response.status_code, response.text)
            if response.status_code not in (200, 202):
                assert runner.run(_stored(pool)) == before

        try:
            check()
        finally:
            runner.run(client.aclose())
            runner.run(pool.close())
            runner.run(lifespan.__aexit__(None, None, None))
    # The generator must reach both acceptance and rejection, or it proves nothing.
    assert 202 in statuses and 401 in statuses and 400 in statuses
