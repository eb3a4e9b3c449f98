"""`create_app`: the sandbox remote as one Starlette application."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware

from sandbox.admin_api import admin_routes
from sandbox.callbacks import CallbackInbox
from sandbox.config import SandboxConfig
from sandbox.connections import ConnectionRegistry
from sandbox.faults import FaultBook
from sandbox.holder import StateHolder
from sandbox.injector import FaultInjector
from sandbox.rate_limit import RateLimiter, settings_from
from sandbox.remote_api import remote_routes
from sandbox.store import ObjectStore


def create_app(config: SandboxConfig, connections: ConnectionRegistry | None = None) -> Starlette:
    """Build the app; reset faults need `connections` shared with the server's protocol."""
    holder = StateHolder(config)
    book = FaultBook(default_seed=config.seed)
    store = ObjectStore(config, holder)
    inbox = CallbackInbox(config, holder)
    limiter = RateLimiter(settings_from(config))
    routes = [
        *remote_routes(store, inbox, limiter),
        *admin_routes(holder, book, store, inbox, limiter),
    ]
    injector = Middleware(FaultInjector, book=book, connections=connections or ConnectionRegistry())
    return Starlette(routes=routes, middleware=[injector])
