"""The dev stack's Temporal launcher: UI up, WF-4 search attributes registered."""

from __future__ import annotations

import httpx
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client

from cli.stack.devconfig import load_dev_config
from cli.stack.temporal import TemporalDevServer


async def test_web_ui_answers(temporal_server: TemporalDevServer, temporal_client: Client) -> None:
    async with httpx.AsyncClient(timeout=5.0) as http:
        response = await http.get(temporal_server.ui_url)
    assert response.status_code == 200


async def test_search_attributes_of_wf4_are_registered(temporal_client: Client) -> None:
    expected = load_dev_config().temporal.search_attributes
    response = await temporal_client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=temporal_client.namespace)
    )
    assert set(expected) <= set(response.custom_attributes)
