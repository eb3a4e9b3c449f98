"""SPEC S-3 in the ingress policy: the production profile refuses legacy signature schemes
and `http://` URLs unless `production_allows` names the exception (logged at start, shown
by the readback); a credential reference is a reference, so a token pasted into
`callback_credential_ref` is refused and `ingress readback --json` never prints it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingress.config import ConfigError, parse_policy, readback
from ingress.server import warn_production_exceptions
from tests.e2e.test_cli_errors import assert_one_line, run
from tests.ingress.support import ENVIRON, policy_document

PASTED = "pat-na1-0f3c9e7a-5b21-4d8e-9a6c-3e2f1b0d7c55"


def _production(**overrides: Any) -> dict[str, Any]:
    document = policy_document("https://api.hubapi.com", ack_drop_endpoints=[], **overrides)
    document["profile"] = "production"
    for endpoint in document["endpoints"]:
        endpoint["signature"]["public_base_url"] = "https://hooks.example.test"
    return document


def _legacy(document: dict[str, Any]) -> dict[str, Any]:
    signature = document["endpoints"][0]["signature"]
    signature.update(scheme="v1", allow_legacy_signature=True)
    signature.pop("timestamp_header")
    return document


def _parse(document: dict[str, Any]) -> Any:
    return parse_policy(yaml.safe_dump(document))


def test_s3_a_production_policy_of_v3_and_https_loads() -> None:
    policy = _parse(_production())
    assert policy.production_exceptions == frozenset()


@pytest.mark.parametrize(
    ("weaken", "field", "allowance"),
    [
        (_legacy, "crm's signature scheme (legacy)", "legacy_signature"),
        (
            lambda d: d["endpoints"][0]["signature"].update(public_base_url="http://h.test") or d,
            "crm's signature.public_base_url (http://)",
            "plain_http",
        ),
        (
            lambda d: d["endpoints"][2].update(callback_base_url="http://127.0.0.1:9") or d,
            "actions's callback_base_url (http://)",
            "plain_http",
        ),
    ],
    ids=["legacy-signature", "http-public-url", "http-callback"],
)
def test_s3_production_refuses_a_weakened_boundary_unless_named_and_logged(
    weaken: Any, field: str, allowance: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError) as info:
        _parse(weaken(_production()))
    assert field in str(info.value) and allowance in str(info.value)
    policy = _parse(weaken(_production(production_allows=[allowance])))
    with caplog.at_level(logging.WARNING, logger="ingress.server"):
        warn_production_exceptions(policy)
    assert f"production profile allows {allowance}" in caplog.text
    assert readback(policy, ENVIRON)["production_allows"] == [allowance]
    # Development keeps its opt-ins (allow_legacy_signature) without the list.
    development = weaken(policy_document())
    assert _parse(development).production_exceptions == frozenset()


def test_s3_a_token_pasted_as_callback_credential_ref_is_refused_never_printed(
    tmp_path: Path,
) -> None:
    document = policy_document()
    document["endpoints"][2]["callback_credential_ref"] = PASTED
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(document))
    result = run("ingress", "readback", "--config", str(path), "--json", env=ENVIRON)
    assert PASTED not in result.stdout + result.stderr
    assert_one_line(result, 2, "callback_credential_ref", "not a secret (value not shown)")
    document["endpoints"][2]["callback_credential_ref"] = "env:HUBSPOT_TOKEN"
    path.write_text(yaml.safe_dump(document))
    shown = run("ingress", "readback", "--config", str(path), "--json", env=ENVIRON)
    assert (
        shown.returncode == 0 and '"callback_credential_ref": "env:HUBSPOT_TOKEN"' in shown.stdout
    )
