"""Fixtures for the strict modes: one real server per mode and module, reset per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest

from sandbox.client import SandboxClient
from sandbox.config import HubSpotLimits, ObjectTypeConfig, SalesforceLimits, SandboxConfig
from sandbox.server import BackgroundSandbox

TOKEN_A = "pat-na1-aaaa"
TOKEN_B = "pat-na1-bbbb"
LOCATOR = "cp_locator"
SF_LOCATOR = "Locator__c"
SF_LEGACY = "Legacy_Id__c"
CONTACTS = "/crm/v3/objects/contacts"
DATA = "/services/data/v59.0"
SF_CONTACTS = f"{DATA}/sobjects/Contact"
SF_ACCOUNTS = f"{DATA}/sobjects/Account"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def hubspot_config() -> SandboxConfig:
    """Contacts unique by email and locator, companies by locator, deals by nothing."""
    object_types = {
        "contacts": ObjectTypeConfig(unique_properties=("email", LOCATOR)),
        "companies": ObjectTypeConfig(unique_properties=(LOCATOR,)),
        "deals": ObjectTypeConfig(),
    }
    return SandboxConfig(mode="hubspot", object_types=object_types, seed=7)


def salesforce_config() -> SandboxConfig:
    """Contacts and accounts with a unique locator; accounts also a shared legacy id."""
    object_types = {
        "Contact": ObjectTypeConfig(unique_properties=(SF_LOCATOR,)),
        "Account": ObjectTypeConfig(unique_properties=(SF_LOCATOR,), external_ids=(SF_LEGACY,)),
    }
    return SandboxConfig(mode="salesforce", object_types=object_types, seed=7)


@dataclass(frozen=True)
class Remote:
    """A sandbox under test: `http` sends TOKEN_A, `admin` steers the sandbox."""

    url: str
    http: httpx.AsyncClient
    admin: SandboxClient


@pytest.fixture(scope="module")
def hubspot_server() -> Iterator[BackgroundSandbox]:
    with BackgroundSandbox(hubspot_config()) as server:
        yield server


@pytest.fixture(scope="module")
def salesforce_server() -> Iterator[BackgroundSandbox]:
    with BackgroundSandbox(salesforce_config()) as server:
        yield server


async def _remote(
    server: BackgroundSandbox, limits: HubSpotLimits | SalesforceLimits
) -> AsyncIterator[Remote]:
    async with httpx.AsyncClient(base_url=server.url, headers=auth(TOKEN_A), timeout=10) as http:
        admin = SandboxClient(server.url, http)
        await admin.reset()
        await admin.set_limits(limits)
        yield Remote(server.url, http, admin)


@pytest.fixture
async def hubspot(hubspot_server: BackgroundSandbox) -> AsyncIterator[Remote]:
    """The hubspot-mode sandbox, reset, with no limits unless a test sets them."""
    async for remote in _remote(hubspot_server, HubSpotLimits(burst=None, daily=None)):
        yield remote


@pytest.fixture
async def salesforce(salesforce_server: BackgroundSandbox) -> AsyncIterator[Remote]:
    """The salesforce-mode sandbox, reset, with the default allocation."""
    async for remote in _remote(salesforce_server, SalesforceLimits()):
        yield remote
