"""How a Temporal client reaches the frontend (S-3): one rule for the worker, the CLI and the
ingress, whose settings name the same environment variables."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import TLSConfig


def temporal_tls(
    ca: str | None, cert: str | None, key: str | None, *, tls: bool, api_key: bool
) -> TLSConfig | bool:
    """How a client reaches the frontend (the worker, the CLI and the ingress alike): a
    client certificate (mTLS) and a private CA (`TEMPORAL_TLS_CA`, S-3) when set, read now;
    else TLS with the system roots when `TEMPORAL_TLS` or an API key asks for it; else
    plain gRPC."""
    mtls = bool(cert and key)
    if ca or mtls:
        return TLSConfig(
            server_root_ca_cert=_read(ca),
            client_cert=_read(cert) if mtls else None,
            client_private_key=_read(key) if mtls else None,
        )
    return tls or api_key


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None
