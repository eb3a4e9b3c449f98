"""The credentials a request carries, read where they are configured (SPEC S-3, STO-3).

A reference's secret is `CONNECTOR_PUSH_CREDENTIAL_<REF>` and the hosts it may be sent to
`CONNECTOR_PUSH_CREDENTIAL_HOSTS_<REF>` (`protocol.credential_hosts`), both read at each
send, so a rotated secret or binding needs no restart. The remote sender and the
workflow-action completion both add their bearer token here, so neither can skip the
binding.
"""

from __future__ import annotations

import os

import httpx

from protocol.credential_hosts import hosts_variable, refusal, secret_variable, target_of


class CredentialNotBound(Exception):
    """S-3: the credential is not bound to the host the request would go to; nothing is
    sent. The message names the reference, the host and the variable, never the secret."""


def bind_credential(request: httpx.Request, credential_ref: str) -> None:
    """Add the bearer token of `CONNECTOR_PUSH_CREDENTIAL_<REF>` to `request` when the host
    it goes to (as httpx parsed it) is bound to the reference in
    `CONNECTOR_PUSH_CREDENTIAL_HOSTS_<REF>` (S-3), else raise `CredentialNotBound`; no
    token, no header; secrets are never stored (STO-3)."""
    token = os.environ.get(secret_variable(credential_ref))
    if not token:
        return
    url = request.url
    target = target_of(url.scheme, url.host, url.port)
    binding = os.environ.get(hosts_variable(credential_ref))
    refused = refusal(credential_ref, url.scheme, target, binding)
    if refused is not None:
        raise CredentialNotBound(refused)
    request.headers.setdefault("Authorization", f"Bearer {token}")
