"""The HubSpot-mode sandbox and examples/hubspot.yaml pointed at it (issue 51's tests).

One session server in the sandbox's `hubspot` mode (examples/sandbox-hubspot.yaml: a
bearer token on every request, no idempotency key, no ETag, the strict limiter), and the
example pack with its base URL re-pointed there and its credential's secret set where
the worker's transport reads it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import pytest
import yaml

from sandbox.config import SandboxConfig
from sandbox.server import BackgroundSandbox

EXAMPLES: Final = Path(__file__).resolve().parents[2] / "examples"
HUBSPOT_PACK: Final = EXAMPLES / "hubspot.yaml"
# The pack's credentialRef is env:HUBSPOT_TOKEN: its secret and the hosts it may reach.
TOKEN: Final = "pat-na1-test-token"
SECRET_VARIABLE: Final = "CONNECTOR_PUSH_CREDENTIAL_ENV_HUBSPOT_TOKEN"
HOSTS_VARIABLE: Final = "CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_HUBSPOT_TOKEN"
REAL_BASE_URL: Final = "https://api.hubapi.com"


def hubspot_config() -> SandboxConfig:
    return SandboxConfig.model_validate(
        yaml.safe_load((EXAMPLES / "sandbox-hubspot.yaml").read_text(encoding="utf-8"))
    )


@pytest.fixture(scope="session")
def hubspot_remote() -> Iterator[BackgroundSandbox]:
    """A second session sandbox, in the hubspot mode."""
    with BackgroundSandbox(hubspot_config()) as server:
        yield server


def set_credential(monkeypatch: pytest.MonkeyPatch, base_url: str) -> None:
    """The pack's secret where the transport reads it, bound to the sandbox's host (S-3)."""
    monkeypatch.setenv(SECRET_VARIABLE, TOKEN)
    monkeypatch.setenv(HOSTS_VARIABLE, urlsplit(base_url).netloc)


@functools.cache
def _hubspot_manifest() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load(HUBSPOT_PACK.read_text(encoding="utf-8"))
    return loaded


def hubspot_manifest(base_url: str) -> dict[str, object]:
    """examples/hubspot.yaml with its profile's baseUrl pointed at `base_url` (a copy)."""
    manifest = copy.deepcopy(_hubspot_manifest())
    profiles = manifest["profiles"]
    assert isinstance(profiles, list)
    for profile in profiles:
        assert profile["baseUrl"] == REAL_BASE_URL
        profile["baseUrl"] = base_url
    return manifest
