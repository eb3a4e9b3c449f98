"""Request signature verification (SPEC ING-3): v3 by default, v2/v1 only by opt-in.

The header names come from the endpoint's policy (`SignaturePolicy`); nothing here
names a vendor.

v3 is base64(HMAC-SHA256(secret, method + uri + raw body + timestamp)) with a
millisecond timestamp bounded in the past and the future. The URI is the public
URL the sender called (configured, never the Host header) with a fixed set of
percent-escapes decoded. Everything is computed over the raw body bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import SecretStr

from ingress.errors import Rejection
from protocol.ingress_policy import SignaturePolicy, SignatureScheme

# Escapes the v3 scheme decodes before signing; the literal `?` that starts the
# query is untouched because it was never escaped.
_DECODED_ESCAPES: Final = re.compile(r"%(3A|2F|3F|40|21|24|27|28|29|2A|2C|3B)", re.IGNORECASE)


@dataclass(frozen=True)
class SignedRequest:
    method: str
    uri: str
    body: bytes
    headers: Mapping[str, str]  # case-insensitive (Starlette `Headers`)


def signing_uri(public_base_url: str, raw_path: bytes, query_string: bytes) -> str:
    """The v3 URI: configured public base + path as received + query, escapes decoded.

    Raises UnicodeDecodeError if the target is not ASCII (the caller's
    `request_uri_resolve_failed`).
    """
    target = raw_path.decode("ascii")
    if query_string:
        target += "?" + query_string.decode("ascii")
    decoded = _DECODED_ESCAPES.sub(lambda m: chr(int(m.group(1), 16)), target)
    return public_base_url.rstrip("/") + decoded


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise Rejection(401, "missing_signature")
    return value


def _equal(expected: str, provided: str) -> bool:
    return hmac.compare_digest(expected.encode("ascii"), provided.encode("latin-1"))


def _check_timestamp(policy: SignaturePolicy, raw: str, now_ms: int) -> None:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 16:
        raise Rejection(401, "bad_timestamp")
    age = now_ms - int(raw)
    if age > policy.max_age_ms:
        raise Rejection(401, "stale_timestamp")
    if -age > policy.max_future_ms:
        raise Rejection(401, "future_timestamp")


@dataclass(frozen=True)
class PresentedSignature:
    """The request's signature headers, as far as the headers alone can check them."""

    signature: str
    timestamp: str = ""  # v3 only


def check_headers(
    policy: SignaturePolicy, headers: Mapping[str, str], now_ms: int
) -> PresentedSignature:
    """What the headers alone decide, before any body byte is read: the signature header
    is there and, for v3, a timestamp within the window; else `Rejection(401)`."""
    provided = _header(headers, policy.signature_header)
    if policy.scheme is not SignatureScheme.V3:
        return PresentedSignature(provided)
    assert policy.timestamp_header is not None, "the policy requires it for v3"
    timestamp = _header(headers, policy.timestamp_header)
    _check_timestamp(policy, timestamp, now_ms)
    return PresentedSignature(provided, timestamp)


def _v3(secret: bytes, request: SignedRequest, presented: PresentedSignature) -> None:
    timestamp = presented.timestamp.encode()
    message = (request.method + request.uri).encode("utf-8") + request.body + timestamp
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    if not _equal(base64.b64encode(digest).decode("ascii"), presented.signature):
        raise Rejection(401, "bad_signature")


def _legacy(
    policy: SignaturePolicy, secret: bytes, request: SignedRequest, presented: PresentedSignature
) -> None:
    if policy.scheme is SignatureScheme.V2:
        message = secret + (request.method + request.uri).encode("utf-8") + request.body
    else:
        message = secret + request.body
    if not _equal(hashlib.sha256(message).hexdigest(), presented.signature.lower()):
        raise Rejection(401, "bad_signature")


def verify_signature(
    policy: SignaturePolicy,
    secret: SecretStr,
    presented: PresentedSignature,
    request: SignedRequest,
) -> None:
    """Return if `presented` (from `check_headers`) signs the request; else `Rejection(401)`."""
    key = secret.get_secret_value().encode("utf-8")
    if policy.scheme is SignatureScheme.V3:
        _v3(key, request, presented)
    else:
        _legacy(policy, key, request, presented)


def verify(policy: SignaturePolicy, secret: SecretStr, request: SignedRequest, now_ms: int) -> None:
    """Return if the request is authentic under the endpoint's scheme; else `Rejection(401)`."""
    verify_signature(policy, secret, check_headers(policy, request.headers, now_ms), request)


def sign_v3(secret: str, method: str, uri: str, body: bytes, timestamp_ms: int) -> str:
    """The v3 signature a sender would send (used by the demo, tests and the benchmark)."""
    message = (method + uri).encode("utf-8") + body + str(timestamp_ms).encode()
    digest = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")
