"""Shared pieces for ingress tests: a policy, signed requests, a live uvicorn server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import uvicorn
import yaml

from ingress.app import IngressApp, create_app, wall_clock_ms
from ingress.config import IngressConfig, parse_policy, resolve_secrets
from ingress.server import uvicorn_config
from ingress.signature import sign_v3
from worker.runtime import tls_context

WEBHOOK_SECRET = "test-webhook-secret"
ACTION_SECRET = "test-action-secret"
PUBLIC_BASE = "https://hooks.example.test"
ENVIRON = {"TEST_WEBHOOK_SECRET": WEBHOOK_SECRET, "TEST_ACTION_SECRET": ACTION_SECRET}

IDENTITY = {
    "kind": "composite",
    "fields": [
        {"path": "appId", "type": "number"},
        {"path": "portalId", "type": "number"},
        {"path": "subscriptionId", "type": "number"},
        {"path": "eventId", "type": "number"},
        {"path": "occurredAt", "type": "number"},
        {"path": "subscriptionType", "type": "string"},
        {"path": "objectId", "type": "number"},
        {"path": "propertyName", "type": "string", "optional": True},
        {"path": "propertyValue", "type": "string", "optional": True},
    ],
    "attempt_path": "attemptNumber",
}


# A must-complete action whose local work is the deletion of its object's links.
ACTION_ROUTE = {
    "handler": "remote_deletion",
    "target_object": "contacts",
    "object_id_path": "object.objectId",
    "scope_path": "origin.portalId",
    "remote_scopes": {"42": "sandbox-portal"},
}
# Webhook deletions: portal 42 is the demo pack's remote scope.
DELETION_ROUTE = {
    "handler": "remote_deletion",
    "target_object": "contacts",
    "scope_path": "portalId",
    "remote_scopes": {"42": "sandbox-portal"},
}


def _signature(secret_env: str) -> dict[str, Any]:
    return {
        "scheme": "v3",
        "secret_env": secret_env,
        "public_base_url": PUBLIC_BASE,
        "signature_header": "X-HubSpot-Signature-v3",
        "timestamp_header": "X-HubSpot-Request-Timestamp",
    }


# Where must-complete completions go unless a test points them at a live sandbox.
UNUSED_CALLBACK_BASE = "http://127.0.0.1:9"


def policy_document(
    callback_base_url: str = UNUSED_CALLBACK_BASE, **overrides: Any
) -> dict[str, Any]:
    webhook = {
        "name": "crm",
        "kind": "webhook",
        "path": "/webhooks/crm",
        "signature": _signature("TEST_WEBHOOK_SECRET"),
        "body_limit": 4096,
        "event_type_field": "subscriptionType",
        "identity": IDENTITY,
        "routes": {
            "contact.deletion": DELETION_ROUTE,
            "contact.propertyChange": "remote_property_change",
        },
    }
    dropping = {**webhook, "name": "crm-drop", "path": "/webhooks/crm-drop"}
    actions = {
        "name": "actions",
        "kind": "workflow_action",
        "path": "/actions/crm",
        "signature": _signature("TEST_ACTION_SECRET"),
        "identity": {"kind": "legacy", "path": "callbackId"},
        "actions": {
            "11": {"policy": "best_effort"},
            "22": {"policy": "must_complete", "block_expiration": "PT2H", "route": ACTION_ROUTE},
        },
        "callback_base_url": callback_base_url,
    }
    document: dict[str, Any] = {
        "profile": "development",
        "ack_drop_endpoints": ["crm-drop"],
        "workflow_action_mode": "proxy",
        "endpoints": [webhook, dropping, actions],
    }
    document.update(overrides)
    return document


def make_config(callback_base_url: str = UNUSED_CALLBACK_BASE, **overrides: Any) -> IngressConfig:
    return config_from(policy_document(callback_base_url, **overrides))


def config_from(document: dict[str, Any]) -> IngressConfig:
    policy = parse_policy(yaml.safe_dump(document))
    return IngressConfig(policy, resolve_secrets(policy, ENVIRON))


def event(
    event_id: int = 1, object_id: int = 100, attempt: int = 0, **extra: Any
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "appId": 7,
        "portalId": 42,
        "subscriptionId": 9,
        "eventId": event_id,
        "occurredAt": 1_700_000_000_000,
        "subscriptionType": "contact.deletion",
        "objectId": object_id,
        "attemptNumber": attempt,
        "changeSource": "CRM",
    }
    base.update(extra)
    return base


def execution(callback_id: str = "cb-1", action_id: int = 22) -> dict[str, Any]:
    return {
        "callbackId": callback_id,
        "origin": {"portalId": 42, "actionDefinitionId": action_id, "actionDefinitionVersion": 1},
        "context": {"source": "WORKFLOWS", "workflowId": 5},
        "object": {"objectId": 100, "objectType": "CONTACT", "properties": {}},
        "inputFields": {},
    }


def encode(document: object) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


def signed_headers(
    body: bytes,
    path: str,
    *,
    secret: str = WEBHOOK_SECRET,
    timestamp_ms: int | None = None,
    method: str = "POST",
) -> dict[str, str]:
    timestamp = wall_clock_ms() if timestamp_ms is None else timestamp_ms
    return {
        "content-type": "application/json",
        "x-hubspot-signature-v3": sign_v3(secret, method, PUBLIC_BASE + path, body, timestamp),
        "x-hubspot-request-timestamp": str(timestamp),
    }


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


async def wait_until(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll an async predicate until it holds (never a bare sleep as synchronisation)."""
    async with asyncio.timeout(timeout_s):
        while not await predicate():
            await asyncio.sleep(0.02)


@dataclass
class Live:
    client: httpx.AsyncClient
    base_url: str
    ingress: IngressApp
    app: Any = None  # the ASGI app the server runs (to call it with a hand-built scope)


@asynccontextmanager
async def live_server(
    config: IngressConfig, database_url: str, **options: Any
) -> AsyncIterator[Live]:
    """A real uvicorn server on a real socket, in this event loop (`options`: `create_app`'s)."""
    app = create_app(config, database_url, **options)
    sock = free_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, config.policy, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        return server.started

    try:
        await wait_until(started, what="uvicorn start")
        base_url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(
            base_url=base_url, timeout=10.0, verify=tls_context()
        ) as client:
            yield Live(client, base_url, app.state.ingress, app)
    finally:
        server.should_exit = True
        await task
        sock.close()


async def counts(pool: asyncpg.Pool) -> Mapping[str, int]:
    async with pool.acquire() as conn:
        return {
            table: await conn.fetchval(f"SELECT count(*) FROM {table}")
            for table in ("ingress_receipt", "connector_event", "workflow_action_execution")
        }


async def no_lock_waiters(pool: asyncpg.Pool) -> bool:
    """No session of this database is waiting on a lock (a cancelled admission is gone)."""
    async with pool.acquire() as conn:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    return waiting == 0


NOTHING_STORED = {"ingress_receipt": 0, "connector_event": 0, "workflow_action_execution": 0}
