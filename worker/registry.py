"""What the worker runs: workflow classes and activity callables, listed once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
import httpx

from activities.hooks import DispatchHooks
from activities.link import LinkActivities
from activities.relay import RelayActivities
from workflows.link import LinkWorkflow
from workflows.relay import RelayWorkflow


def workflow_classes() -> Sequence[type]:
    """Every workflow class the `connector-push` task queue serves."""
    return [LinkWorkflow, RelayWorkflow]


def activity_callables(
    pool: asyncpg.Pool, http: httpx.AsyncClient, hooks: DispatchHooks | None = None
) -> Sequence[Callable[..., Any]]:
    """Activity methods bound to the shared pool and HTTP client."""
    link = LinkActivities(pool, http, hooks)
    relay = RelayActivities(pool)
    return [
        link.dispatch_create,
        link.dispatch_patch,
        link.write_mirror,
        link.apply_operator_action,
        link.apply_remote_evidence,
        link.park_exhausted,
        relay.wake_links_with_pending_work,
    ]
