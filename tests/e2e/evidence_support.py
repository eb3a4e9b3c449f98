"""Shared by the issue-10 evidence tests: wait for an attempt's status, and read a refused
update's whole cause chain."""

from __future__ import annotations

import asyncpg

from tests.e2e.conftest import Stack
from tests.e2e.support import eventually


async def status_of(stack: Stack, key: str, status: str, timeout_s: float = 30.0) -> asyncpg.Record:
    return await eventually(lambda: stack.attempt(key), lambda r: r["status"] == status, timeout_s)


def refusal_chain(error: BaseException) -> str:
    """The whole cause chain of a refused update (update -> activity -> application)."""
    parts = []
    node: BaseException | None = error
    while node is not None:
        parts.append(str(node))
        node = node.__cause__ or getattr(node, "cause", None)
    return " | ".join(parts)
