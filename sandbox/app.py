"""`create_app`: the sandbox remote as one Starlette application, in the config's mode."""

from __future__ import annotations

from typing import assert_never

from starlette.applications import Starlette
from starlette.middleware import Middleware

from sandbox.admin_api import admin_routes
from sandbox.callbacks import CallbackInbox
from sandbox.config import SandboxConfig
from sandbox.connections import ConnectionRegistry
from sandbox.faults import FaultBook
from sandbox.holder import StateHolder
from sandbox.hubspot import hubspot_app
from sandbox.injector import FaultInjector
from sandbox.rate_limit import RateLimiter, settings_from
from sandbox.remote_api import remote_routes
from sandbox.salesforce import salesforce_app
from sandbox.store import ObjectStore


def create_app(config: SandboxConfig, connections: ConnectionRegistry | None = None) -> Starlette:
    """Build the app; reset faults need `connections` shared with the server's protocol."""
    connections = connections or ConnectionRegistry()
    match config.mode:
        case "generous":
            return generous_app(config, connections)
        case "hubspot":
            return hubspot_app(config, connections)
        case "salesforce":
            return salesforce_app(config, connections)
        case _:
            assert_never(config.mode)


def generous_app(config: SandboxConfig, connections: ConnectionRegistry) -> Starlette:
    """HubSpot-shaped, with the extras the demo pack declares (Idempotency-Key, If-Match)."""
    holder = StateHolder(config)
    book = FaultBook(default_seed=config.seed)
    store = ObjectStore(config, holder)
    inbox = CallbackInbox(config, holder)
    limiter = RateLimiter(settings_from(config))
    routes = [
        *remote_routes(store, inbox, limiter),
        *admin_routes(holder, book, store, inbox, limiter),
    ]
    injector = Middleware(FaultInjector, book=book, connections=connections)
    return Starlette(routes=routes, middleware=[injector])
