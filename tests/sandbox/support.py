"""Helpers shared by the sandbox tests: the test config and a polling wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx

from sandbox.config import ObjectTypeConfig, SandboxConfig

T = TypeVar("T")

LOCATOR = "cp_locator"
CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"


def make_config(**overrides: object) -> SandboxConfig:
    """The test config: contacts honour idempotency keys, companies do not."""
    object_types = {
        "contacts": ObjectTypeConfig(unique_properties=("email", LOCATOR), idempotency=True),
        "companies": ObjectTypeConfig(unique_properties=(LOCATOR,)),
        "deals": ObjectTypeConfig(),
    }
    return SandboxConfig.model_validate({"object_types": object_types, "seed": 7, **overrides})


def contact(email: str, **extra: str) -> dict[str, object]:
    """A create/patch body for a contact."""
    return {"properties": {"email": email, **extra}}


async def eventually(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout_s: float = 10.0
) -> T:
    """Poll `probe` until `done` holds for its value, or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if done(value) or time.monotonic() > deadline:
            assert done(value), f"condition not met within {timeout_s}s: {value!r}"
            return value
        await asyncio.sleep(0.02)  # poll interval; the outcome is what `done` checks


TRANSPORT_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError)
