"""NF-1: with CONNECTOR_PUSH_METRICS_BIND_ADDRESS set, the SDK serves Prometheus metrics."""

from __future__ import annotations

import httpx
import pytest
from temporalio.client import Client

from cli.stack.process import free_port
from cli.stack.temporal import TemporalDevServer
from worker.client import connect_temporal, sdk_runtime
from worker.settings import RuntimeSettings


def test_no_bind_address_means_no_metrics_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONNECTOR_PUSH_METRICS_BIND_ADDRESS", raising=False)
    assert sdk_runtime(RuntimeSettings()) is None


async def test_sdk_metrics_are_served_where_configured(
    temporal_server: TemporalDevServer, temporal_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    del temporal_client  # only to have the server ready
    bind = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("CONNECTOR_PUSH_METRICS_BIND_ADDRESS", bind)
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_server.address)
    settings = RuntimeSettings()
    client = await connect_temporal(settings, sdk_runtime(settings))
    await client.count_workflows()  # one RPC, so the client has something to report
    async with httpx.AsyncClient(timeout=5.0) as http:
        response = await http.get(f"http://{bind}/metrics")
    assert response.status_code == 200
    assert "temporal_request" in response.text
