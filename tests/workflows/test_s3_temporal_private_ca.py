"""SPEC S-3: the worker's and the CLI's Temporal connection (`worker.client.connect_temporal`)
trusts a private CA named by `TEMPORAL_TLS_CA`. A real TLS handshake: the session's real
Temporal dev server behind a TLS-terminating proxy on 127.0.0.1 whose certificate a
throwaway CA signed (made with `openssl`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.client import Client

from cli.stack.temporal import TemporalDevServer
from ingress.app import connect_lazily
from ingress.config import IngressSettings
from tests.fixtures.tls import PrivateCa, make_private_ca
from worker.client import connect_temporal
from worker.settings import RuntimeSettings


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def _tls_proxy(ca: PrivateCa, upstream: str) -> AsyncIterator[str]:
    """TLS (ALPN h2, as gRPC asks) on 127.0.0.1, forwarded in the clear to `upstream`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(ca.server_cert, ca.server_key)
    context.set_alpn_protocols(["h2"])
    host, port = upstream.rsplit(":", 1)
    streams: set[asyncio.Task[None]] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        for task in (_pipe(reader, up_writer), _pipe(up_reader, writer)):
            streams.add(asyncio.create_task(task))

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)


@pytest.fixture
def private_ca(tmp_path: Path) -> PrivateCa:
    return make_private_ca(tmp_path)


async def test_s3_temporal_tls_ca_lets_the_client_verify_a_private_frontend(
    temporal_client: Client, temporal_server: TemporalDevServer, private_ca: PrivateCa
) -> None:
    """With TEMPORAL_TLS_CA the handshake verifies and the namespace answers; with the
    system roots alone (TEMPORAL_TLS=true, the only choice before) it is refused."""
    namespace = temporal_server.config.namespace
    async with _tls_proxy(private_ca, temporal_server.address) as address:
        trusted = RuntimeSettings.model_validate(
            {"temporal_address": address, "temporal_namespace": namespace}
            | {"temporal_tls_ca": str(private_ca.ca)}
        )
        client = await connect_temporal(trusted)
        assert (await client.count_workflows("WorkflowId = 'none'")).count == 0
        untrusted = trusted.model_copy(update={"temporal_tls_ca": None, "temporal_tls": True})
        with pytest.raises(RuntimeError, match=r"(?i)certificate|UnknownIssuer"):
            await connect_temporal(untrusted)


async def test_s3_the_ingress_trusts_the_same_private_ca(
    temporal_client: Client, temporal_server: TemporalDevServer, private_ca: PrivateCa
) -> None:
    """The ingress starts processing workflows (ING-6) through its own client: the same
    `TEMPORAL_TLS_CA` reaches it (it had only `TEMPORAL_TLS`, the system roots)."""
    namespace = temporal_server.config.namespace
    async with _tls_proxy(private_ca, temporal_server.address) as address:
        env = {
            "DATABASE_URL": "postgresql://unused",
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": namespace,
            "TEMPORAL_TLS_CA": str(private_ca.ca),
        }
        settings = IngressSettings.model_validate(env)
        target = settings.temporal_target()
        assert target is not None
        client = await connect_lazily(target)
        assert (await client.count_workflows("WorkflowId = 'none'")).count == 0
        untrusted = replace(target, tls_ca=None, tls=True)
        with pytest.raises(RuntimeError, match=r"(?i)certificate|UnknownIssuer"):
            await (await connect_lazily(untrusted)).count_workflows("WorkflowId = 'none'")


def test_s3_the_ingress_refuses_half_a_client_certificate_or_a_missing_file(
    private_ca: PrivateCa,
) -> None:
    env = {"DATABASE_URL": "postgresql://unused", "TEMPORAL_TLS_CERT": str(private_ca.ca)}
    with pytest.raises(ValidationError, match="set both or neither"):
        IngressSettings.model_validate(env)
    env = {"DATABASE_URL": "postgresql://unused", "TEMPORAL_TLS_CA": "/nonexistent/ca.pem"}
    with pytest.raises(ValidationError, match="TEMPORAL_TLS_CA: not a readable file"):
        IngressSettings.model_validate(env)
