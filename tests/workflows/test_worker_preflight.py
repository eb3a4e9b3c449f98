"""SPEC WF-4: the worker refuses to start when a search attribute is missing."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client

from cli.stack.devconfig import load_dev_config
from worker.runtime import MissingSearchAttributes, ensure_search_attributes
from workflows import search_attributes


def test_dev_stack_registers_exactly_the_attributes_workflows_upsert() -> None:
    registered = load_dev_config().temporal.search_attributes
    declared = {key.name: key.indexed_value_type.name.title() for key in search_attributes.ALL}
    assert registered == declared


async def test_preflight_passes_on_the_dev_stack_namespace(temporal_client: Client) -> None:
    await ensure_search_attributes(temporal_client)


async def test_preflight_refuses_a_namespace_without_them(temporal_client: Client) -> None:
    namespace = f"bare-{uuid.uuid4().hex[:8]}"
    retention = Duration()
    retention.FromTimedelta(timedelta(days=1))
    await temporal_client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=retention)
    )
    address = temporal_client.service_client.config.target_host
    bare = await Client.connect(address, namespace=namespace)
    with pytest.raises(MissingSearchAttributes, match="LinkKey=Keyword"):
        await ensure_search_attributes(bare)
