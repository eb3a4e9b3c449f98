"""v3 signature verification (ING-3): an independent HMAC, URI decoding, time window.

The header names are the endpoint policy's (issue 15, seed 004 "L0 contains no
HubSpot-specific names"): these tests use a made-up vendor's names throughout.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.datastructures import Headers

from ingress.errors import Rejection
from ingress.signature import SignedRequest, signing_uri, verify
from protocol.ingress_policy import SignaturePolicy

POLICY = SignaturePolicy(
    secret_env="S",
    public_base_url="https://hooks.example.test",
    signature_header="X-Acme-Signature",
    timestamp_header="X-Acme-Timestamp",
)
SECRET = SecretStr("shh")
NOW = 1_700_000_000_000


def _independent_v3(method: str, uri: str, body: bytes, ts: int) -> str:
    message = f"{method}{uri}".encode() + body + str(ts).encode()
    return base64.b64encode(hmac.new(b"shh", message, hashlib.sha256).digest()).decode()


def _request(
    body: bytes, ts: int, signature: str, uri: str = "https://hooks.example.test/w"
) -> SignedRequest:
    headers = Headers({"x-acme-signature": signature, "x-acme-timestamp": str(ts)})
    return SignedRequest("POST", uri, body, headers)


def test_valid_signature_over_raw_non_ascii_bytes() -> None:
    body = '[{"v":"ä \\u00e4"}]'.encode()
    uri = "https://hooks.example.test/w"
    verify(POLICY, SECRET, _request(body, NOW, _independent_v3("POST", uri, body, NOW)), NOW)


@pytest.mark.parametrize(
    ("delta_ms", "reason"),
    [(300_001, "stale_timestamp"), (-60_001, "future_timestamp")],
)
def test_timestamp_window(delta_ms: int, reason: str) -> None:
    ts = NOW - delta_ms
    uri = "https://hooks.example.test/w"
    request = _request(b"[]", ts, _independent_v3("POST", uri, b"[]", ts))
    with pytest.raises(Rejection) as caught:
        verify(POLICY, SECRET, request, NOW)
    assert (caught.value.status, caught.value.reason) == (401, reason)


def test_edges_of_the_window_are_accepted() -> None:
    uri = "https://hooks.example.test/w"
    for ts in (NOW - 300_000, NOW + 60_000):
        verify(POLICY, SECRET, _request(b"[]", ts, _independent_v3("POST", uri, b"[]", ts)), NOW)


def test_wrong_secret_and_tampering_fail() -> None:
    uri = "https://hooks.example.test/w"
    good = _independent_v3("POST", uri, b"[1]", NOW)
    for request in (
        _request(b"[2]", NOW, good),
        _request(b"[1]", NOW, good, uri="https://hooks.example.test/x"),
        _request(b"[1]", NOW, good[:-2] + "AA"),
    ):
        with pytest.raises(Rejection, match="bad_signature"):
            verify(POLICY, SECRET, request, NOW)


def test_missing_headers_fail() -> None:
    with pytest.raises(Rejection, match="missing_signature"):
        verify(POLICY, SECRET, SignedRequest("POST", "u", b"", Headers({})), NOW)


def test_uri_decodes_exactly_the_listed_escapes() -> None:
    uri = signing_uri(
        "https://hooks.example.test/",
        b"/w/a%3Ab%2fc%20d",
        b"q=%3F%40%21%24%27%28%29%2A%2C%3B%25&x=%2B",
    )
    assert uri == "https://hooks.example.test/w/a:b/c%20d?q=?@!$'()*,;%25&x=%2B"


def test_uri_ignores_the_host_header_and_uses_the_configured_base() -> None:
    assert (
        signing_uri("https://public.example/prefix", b"/w", b"")
        == "https://public.example/prefix/w"
    )


def test_the_header_names_are_the_policys_not_a_vendors() -> None:
    """A correctly signed request under other header names is unsigned for this endpoint."""
    uri = "https://hooks.example.test/w"
    signature = _independent_v3("POST", uri, b"[]", NOW)
    hubspot = Headers(
        {"x-hubspot-signature-v3": signature, "x-hubspot-request-timestamp": str(NOW)}
    )
    with pytest.raises(Rejection) as caught:
        verify(POLICY, SECRET, SignedRequest("POST", uri, b"[]", hubspot), NOW)
    assert (caught.value.status, caught.value.reason) == (401, "missing_signature")


@pytest.mark.parametrize(
    ("drop", "message"),
    [("signature_header", "signature_header"), ("timestamp_header", "timestamp_header")],
)
def test_a_policy_must_name_its_headers(drop: str, message: str) -> None:
    fields = POLICY.model_dump()
    del fields[drop]
    with pytest.raises(ValueError, match=message):
        SignaturePolicy.model_validate(fields)


def test_the_ingress_core_names_no_vendor() -> None:
    root = Path(__file__).resolve().parents[2] / "ingress"
    named = [p.name for p in root.rglob("*.py") if "hubspot" in p.read_text().lower()]
    assert named == []
