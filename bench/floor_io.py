"""floor_io (issue 32): the floor workflow whose activity does the I/O a create cannot
avoid, minimally, so P1_io = creates/s over floor_io/s measures our overhead above it.

A create commits three Postgres transactions (P2 = 3.00; the CRM entry's admission, the
activity's claim with its RemoteIOStartedAt checkpoint, and its finalize + mirror) and
sends one POST. The floor_io activity does the same count, each transaction a single
statement on `bench_floor_io` in the bench database — a copy of `connector_push_attempt`
(`LIKE ... INCLUDING ALL`: its columns, defaults, checks and indexes; not its foreign
keys or its guard triggers, which are the product's choice), with the columns of the
frozen request beside them in the same row (the product keeps those in a row of their
own since migration 0350), written with a real attempt's values, so every row is as
wide as a create's was — and one POST to the sandbox through the worker's HTTP client
(`remote_http_client`):

1. INSERT the pending row (the admission's analogue);
2. UPDATE it to processing with a claim token and its checkpoint (the claim);
3. the POST; 4. UPDATE it to finalized with the remote id and the response (finalize).

The row template is read once from an attempt the warm-up round finalized. No lock, no
journal, no mirror, no second table: those are the product's, and they are the overhead
the ratio shows.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from bench.floor import FloorInput
from protocol.request import wire_body

TABLE: Final = "bench_floor_io"
ACTIVITY: Final = "floor_io"
CREATE_TABLE: Final = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (LIKE connector_push_attempt INCLUDING ALL, "
    "action_type text, connector_namespace text, flow_developer_name text, "
    "flow_action_name text, flow_version text, target_object text, profile_name text, "
    "pack_install_id uuid, request_idempotency_key text, request_snapshot jsonb, "
    "authority_snapshot jsonb, writeback_snapshot jsonb)"
)

# Columns a create's admission writes, then those its finalize writes (with remote_id).
ADMITTED: Final = (
    "connector_owner_key",
    "action_slot_id",
    "action_type",
    "source_object",
    "source_record_id",
    "destination_slot_id",
    "connector_namespace",
    "flow_developer_name",
    "flow_action_name",
    "flow_version",
    "target_object",
    "profile_name",
    "pack_install_id",
    "dispatch_lane",
    "attempt_ordinal",
    "request_snapshot",
    "authority_snapshot",
)
FINALIZED: Final = ("response_snapshot", "writeback_snapshot", "mirror_status")

_INSERT: Final = (
    f"INSERT INTO {TABLE} (link_key, request_idempotency_key, status, {', '.join(ADMITTED)}) "
    f"VALUES ($1, $2, 'pending', {', '.join(f'${i + 3}' for i in range(len(ADMITTED)))}) "
    "RETURNING attempt_id"
)
_CLAIM: Final = (
    f"UPDATE {TABLE} SET status = 'processing', claim_token = $2, claimed_at = now(), "
    "claim_expires_at = now() + interval '5 minutes', remote_io_started_at = now(), "
    "updated_at = now() WHERE attempt_id = $1 AND status = 'pending'"
)
_FINALIZE: Final = (
    f"UPDATE {TABLE} SET status = 'finalized', remote_id = $3, response_snapshot = $4, "
    "writeback_snapshot = $5, mirror_status = $6, updated_at = now() "
    "WHERE attempt_id = $1 AND claim_token = $2"
)


@dataclass(frozen=True)
class RowTemplate:
    """A finalized attempt's values (jsonb as text), and the POST its request made."""

    admitted: tuple[Any, ...]
    finalized: tuple[Any, ...]
    path: str
    body: dict[str, Any]


async def prepare(dsn: str) -> RowTemplate:
    """Create the table (once) and read the template from a finalized attempt."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(CREATE_TABLE)
        columns = ", ".join((*ADMITTED, *FINALIZED))
        row = await conn.fetchrow(
            f"SELECT {columns} FROM connector_push_attempt JOIN connector_push_attempt_frozen"
            " USING (attempt_id) WHERE status = 'finalized' LIMIT 1"
        )
    finally:
        await conn.close()
    if row is None:
        raise RuntimeError("floor_io needs a finalized attempt: run a product round first")
    values = tuple(row.values())
    request = json.loads(row["request_snapshot"])
    return RowTemplate(
        values[: len(ADMITTED)], values[len(ADMITTED) :], request["relative_path"], request["body"]
    )


def _body(template: RowTemplate, key: str) -> bytes:
    """The template's body with a unique email: the sandbox's contacts are unique by it."""
    properties = {**template.body["properties"], "email": f"{_digest(key)[:24]}@floor.example"}
    return wire_body({**template.body, "properties": properties})


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class FloorIO:
    """The floor_io activity over the bench's pool and the worker's HTTP client."""

    def __init__(
        self, pool: asyncpg.Pool, http: httpx.AsyncClient, base_url: str, template: RowTemplate
    ) -> None:
        self._pool, self._http, self._template = pool, http, template
        self._url = base_url + template.path

    @activity.defn(name=ACTIVITY)
    async def floor_io(self, input: FloorInput) -> str:
        """One try only: a retry would meet its own row's unique key and fail forever, so
        a failure fails the floor workflow and the round says so instead of hanging."""
        try:
            return await self._io(input.key)
        except Exception as error:
            raise ApplicationError(f"floor_io: {error!r}", non_retryable=True) from error

    async def _io(self, key: str) -> str:
        template = self._template
        attempt_id = await self._pool.fetchval(
            _INSERT, f"lk1_{_digest(key)}", key, *template.admitted
        )
        token = uuid.uuid4()
        await self._pool.execute(_CLAIM, attempt_id, token)
        response = await self._post(key)
        response.raise_for_status()
        remote_id = str(response.json()["id"])
        await self._pool.execute(_FINALIZE, attempt_id, token, remote_id, *template.finalized)
        return remote_id

    async def _post(self, key: str) -> httpx.Response:
        """The POST, sent once more with the same idempotency key when the connection
        failed, as the product does for this replay-safe profile (a reset after the send
        re-sends the frozen request). Without it, one connection reset (seen once, at
        N = 3,000) failed the floor_io workflow, its round and the whole bench run, while
        the product's round rode it out."""
        body = _body(self._template, key)
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        try:
            return await self._http.post(self._url, content=body, headers=headers)
        except httpx.TransportError:
            return await self._http.post(self._url, content=body, headers=headers)
