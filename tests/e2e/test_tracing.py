"""NF-1: one create produces Temporal, Postgres and remote-HTTP spans, checked in memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.service import RPCError

from protocol.admission import SaveRequest
from sandbox.client import SandboxClient
from tests.e2e.conftest import OWNER, contact_key
from tests.e2e.support import eventually
from worker.crm import report_save
from worker.runtime import build_worker, remote_http_client


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()


async def test_a_create_is_traced_end_to_end(
    spans: InMemorySpanExporter,
    demo_db: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    sandbox: SandboxClient,
) -> None:
    config = temporal_client.config()
    config["interceptors"] = [TracingInterceptor()]
    traced = Client(**config)
    save = SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id="push-contact",
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id="c-001",
        originating_user_id="alice",
    )
    key = contact_key("c-001")
    async with remote_http_client() as http, build_worker(traced, demo_db, http, task_queue):
        await report_save(demo_db, traced, task_queue, save)
        await eventually(
            lambda: demo_db.fetchval(
                "SELECT status FROM connector_push_attempt WHERE link_key = $1", key
            ),
            lambda status: status == "finalized",
        )
        with contextlib.suppress(RPCError):  # a clean create's run ends by itself (WF-1')
            await traced.get_workflow_handle(f"link/{key}").terminate("test finished")
    names = {span.name for span in spans.get_finished_spans()}
    assert {"RunActivity:dispatch_create", "postgres dispatch_create", "remote POST"} <= names, (
        names
    )
    assert any(n.startswith(("StartWorkflow", "SignalWithStartWorkflow")) for n in names)
    [post] = [s for s in spans.get_finished_spans() if s.name == "remote POST"]
    assert post.attributes is not None and post.attributes["http.status_code"] == 201
