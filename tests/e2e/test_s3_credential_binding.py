"""SPEC S-3 at the one sender (`services.remote.send`), over real HTTP on 127.0.0.1: a
credential leaves only for a host bound to it where it is configured
(`CONNECTOR_PUSH_CREDENTIAL_HOSTS_<REF>`), whatever the pack's `baseUrl` says. A refused
try never opens a connection, is `not_sent`, and is logged naming the reference and the
host, never the secret."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from pydantic import JsonValue

from protocol.manifest import parse_manifest
from protocol.outcome import Transport
from protocol.snapshots import ProfileSnapshot
from services import remote
from tests.e2e.conftest import demo_manifest
from worker.runtime import remote_http_client

TOKEN = "s3-test-token-7f1c"
SECRET_VAR = "CONNECTOR_PUSH_CREDENTIAL_ENV_SANDBOX_TOKEN"
HOSTS_VAR = "CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_SANDBOX_TOKEN"
ANSWER = (
    b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n"
    b'{"id":"1"}'
)


@dataclass
class Recorder:
    """A real HTTP server on 127.0.0.1 keeping each request head it was sent."""

    port: int = 0
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            ),
            0,
        )
        await reader.readexactly(length)
        self.heads.append(head)
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    recorder = Recorder()
    server = await asyncio.start_server(recorder.serve, "127.0.0.1", 0)
    recorder.port = server.sockets[0].getsockname()[1]
    async with server:
        yield recorder


def _profile(base_url: str) -> ProfileSnapshot:
    """The demo's plain profile (`credentialRef: env:SANDBOX_TOKEN`) pointed at `base_url`."""
    return ProfileSnapshot.of(parse_manifest(demo_manifest(base_url)).profiles[1])


async def _post(base_url: str, path: str = "/crm/v3/objects/companies") -> Transport:
    async with remote_http_client() as http:
        body: JsonValue = {"properties": {"name": "Acme"}}
        obs = await remote.send(http, "POST", _profile(base_url), path, {}, body)
    return obs.transport


async def test_s3_only_while_bound_does_the_host_get_the_credential(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read at each send: bound, the token goes; the binding removed, the next try is refused
    unconnected (no restart); no token at all, nothing secret leaves and nothing is refused."""
    monkeypatch.setenv(SECRET_VAR, TOKEN)
    monkeypatch.setenv(HOSTS_VAR, f"api.hubapi.com,127.0.0.1:{recorder.port}")
    assert await _post(recorder.url) is Transport.RESPONSE
    (head,) = recorder.heads
    assert f"authorization: bearer {TOKEN}".encode() in head.lower()
    monkeypatch.delenv(HOSTS_VAR)
    assert await _post(recorder.url) is Transport.NOT_SENT
    assert recorder.connections == 1
    monkeypatch.delenv(SECRET_VAR)
    assert await _post(recorder.url) is Transport.RESPONSE
    assert b"authorization" not in recorder.heads[1].lower()


@pytest.mark.parametrize(
    "binding",
    [None, "127.0.0.1", "localhost:{port}", "127.0.0.1:{other}", "api.hubapi.com"],
    ids=["unbound", "default-port-only", "another-name", "another-port", "another-host"],
)
async def test_s3_a_host_not_bound_gets_nothing_and_the_refusal_names_ref_and_host(
    recorder: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    binding: str | None,
) -> None:
    monkeypatch.setenv(SECRET_VAR, TOKEN)
    if binding is not None:
        monkeypatch.setenv(HOSTS_VAR, binding.format(port=recorder.port, other=recorder.port + 1))
    else:
        monkeypatch.delenv(HOSTS_VAR, raising=False)
    with caplog.at_level(logging.WARNING, logger="services.remote"):
        assert await _post(recorder.url) is Transport.NOT_SENT
    assert recorder.connections == 0 and recorder.heads == []
    logged = caplog.text
    assert "env:SANDBOX_TOKEN" in logged and f"127.0.0.1:{recorder.port}" in logged
    assert HOSTS_VAR in logged and TOKEN not in logged


async def test_s3_the_host_checked_is_the_one_the_client_would_connect_to(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A path that turns the bound base URL's authority into user information sends the
    request elsewhere (`http://127.0.0.1:P@elsewhere.invalid/...`): refused, unconnected."""
    monkeypatch.setenv(SECRET_VAR, TOKEN)
    monkeypatch.setenv(HOSTS_VAR, f"127.0.0.1:{recorder.port}")
    with caplog.at_level(logging.WARNING, logger="services.remote"):
        assert await _post(recorder.url, "@elsewhere.invalid/x") is Transport.NOT_SENT
    assert "elsewhere.invalid:80" in caplog.text and TOKEN not in caplog.text
    assert recorder.connections == 0
