"""Shared pieces for the HTTP save API tests: a policy with two clients, a live server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import yaml

from ingress.config import IngressConfig, parse_policy, resolve_save_api_keys, resolve_secrets
from tests.e2e.conftest import OWNER
from tests.ingress.support import ENVIRON as INGRESS_ENVIRON
from tests.ingress.support import Live, live_server, policy_document

CRM_KEY = "crm-key-0123456789"
OTHER_KEY = "other-key-9876543210"
ENVIRON = {**INGRESS_ENVIRON, "TEST_SAVE_KEY_CRM": CRM_KEY, "TEST_SAVE_KEY_OTHER": OTHER_KEY}
AUTH = {"authorization": f"Bearer {CRM_KEY}"}
OTHER_AUTH = {"authorization": f"Bearer {OTHER_KEY}"}


def save_api_config(**save_api: Any) -> IngressConfig:
    """The ingress tests' policy plus a `save_api` section (same file, same server)."""
    section = {
        "clients": [
            {"name": "crm", "key_env": "TEST_SAVE_KEY_CRM", "owners": [OWNER]},
            {"name": "other", "key_env": "TEST_SAVE_KEY_OTHER", "owners": [OWNER]},
        ],
        "max_batch": 5,
        "body_limit": 8192,
        **save_api,
    }
    policy = parse_policy(yaml.safe_dump(policy_document(save_api=section)))
    return IngressConfig(
        policy, resolve_secrets(policy, ENVIRON), resolve_save_api_keys(policy, ENVIRON)
    )


def save_body(record_id: str = "c-001", **overrides: Any) -> dict[str, Any]:
    body = {
        "ownerKey": OWNER,
        "actionSlot": "push-contact",
        "destinationSlot": "remote-contacts",
        "sourceObject": "Contact",
        "recordId": record_id,
        "userId": "alice",
    }
    body.update(overrides)
    return body


@asynccontextmanager
async def save_server(dsn: str, **options: Any) -> AsyncIterator[Live]:
    async with live_server(save_api_config(), dsn, **options) as live:
        yield live


async def stored(pool: asyncpg.Pool) -> dict[str, int]:
    """Rows the save API can write: attempts, queued PATCHes, idempotency records."""
    async with pool.acquire() as conn:
        return {
            table: await conn.fetchval(f"SELECT count(*) FROM {table}")
            for table in ("connector_push_attempt", "connector_patch_dispatch", "save_api_request")
        }
