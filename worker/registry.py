"""What the worker runs: workflow classes and activity callables, listed once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
import httpx


def workflow_classes() -> Sequence[type]:
    """Every workflow class the `connector-push` task queue serves."""
    return []


def activity_callables(pool: asyncpg.Pool, http: httpx.AsyncClient) -> Sequence[Callable[..., Any]]:
    """Activity methods bound to the shared pool and HTTP client."""
    del pool, http
    return []
