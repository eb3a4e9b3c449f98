"""The modes' configs: the examples load and `connector-push sandbox --config` serves them;
a setting another mode would ignore is refused; the default mode is the generous one."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.stack.sandbox_cmd import load_sandbox_config
from sandbox.config import ObjectTypeConfig, RateLimitConfig, SandboxConfig
from tests.sandbox.modes.conftest import TOKEN_A, auth
from tests.sandbox.support import eventually

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def health(http: httpx.AsyncClient) -> int:
    try:
        return (await http.get("/_sandbox/health")).status_code
    except httpx.TransportError:
        return 0


def test_the_default_mode_is_the_generous_one() -> None:
    assert SandboxConfig().mode == "generous"
    assert load_sandbox_config(EXAMPLES / "sandbox.yaml", None).mode == "generous"


@pytest.fixture(params=["hubspot", "salesforce"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """`python -m cli sandbox --config examples/sandbox-MODE.yaml` on a free port."""
    mode: str = request.param
    port = free_port()
    command = [sys.executable, "-m", "cli", "sandbox", "--port", str(port),
               "--config", str(EXAMPLES / f"sandbox-{mode}.yaml")]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield mode, f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(15)


async def test_the_cli_serves_each_example_in_its_mode(served: tuple[str, str]) -> None:
    mode, url = served
    path, body = {
        "hubspot": ("/crm/v3/objects/contacts", {"properties": {"email": "a@example.com"}}),
        "salesforce": ("/services/data/v59.0/sobjects/Contact/", {"LastName": "Ng"}),
    }[mode]
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        await eventually(lambda: health(http), lambda status: status == 200, timeout_s=30.0)
        anonymous = await http.post(path, json=body)
        created = await http.post(path, json=body, headers=auth(TOKEN_A))
        limits = (await http.get("/_sandbox/limits")).json()

    assert anonymous.status_code == 401
    assert created.status_code == 201
    assert limits["mode"] == mode


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"mode": "hubspot", "object_types": {"contacts": {"idempotency": True}}}, "idempotency"),
        ({"mode": "hubspot", "rate_limit": {"requests": 1, "per_seconds": 1}}, "rate_limit"),
        ({"mode": "salesforce", "hubspot_limits": {}}, "hubspot_limits"),
        ({"salesforce_limits": {"allocation": 5}}, "salesforce_limits"),
        ({"object_types": {"contacts": {"external_ids": ["x"]}}}, "external_ids"),
    ],
)
def test_a_setting_the_mode_would_ignore_is_refused(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SandboxConfig.model_validate(fields)


def test_the_rate_limit_flag_is_refused_in_a_strict_mode() -> None:
    with pytest.raises(ValueError, match="hubspot_limits"):
        load_sandbox_config(EXAMPLES / "sandbox-hubspot.yaml", None, "100/10")


def test_the_examples_declare_their_limits() -> None:
    hubspot = load_sandbox_config(EXAMPLES / "sandbox-hubspot.yaml", None)
    salesforce = load_sandbox_config(EXAMPLES / "sandbox-salesforce.yaml", None)

    assert hubspot.hubspot_limits.burst == RateLimitConfig(requests=100, per_seconds=10)
    assert salesforce.salesforce_limits.allocation == 15_000
    assert salesforce.object_types["Account"] == ObjectTypeConfig(
        unique_properties=("Connector_Push_Locator__c",), external_ids=("Legacy_Id__c",)
    )
