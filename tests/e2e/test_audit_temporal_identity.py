"""SPEC S-5: an operator action sent as a workflow Update (the Web UI, the `temporal` CLI,
any SDK client) is audited with the client identity the Temporal server recorded for
that update, beside the operator the request declares."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from cli.stack.temporal import TemporalDevServer
from protocol.messages import LinkView, RetireInput
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.patch_support import finalized_contact
from tests.e2e.support import eventually
from worker.crm import wake_link, workflow_id
from workflows.link import LinkWorkflow

OPS_LAPTOP = "ops-laptop@example"


async def test_s5_an_update_from_another_client_is_audited_with_that_clients_identity(
    stack: Stack, temporal_server: TemporalDevServer
) -> None:
    """The worker's client is not the one that sent the update: the entry names the
    sender's identity (read from the update's accepted event), not the worker's."""
    await finalized_contact(stack)
    key = contact_key("c-001")
    ops = await Client.connect(
        temporal_server.address,
        namespace=temporal_server.config.namespace,
        data_converter=pydantic_data_converter,
        identity=OPS_LAPTOP,
    )
    assert ops.identity != stack.client.identity
    await wake_link(ops, stack.task_queue, key, None, for_operator=True)
    handle = ops.get_workflow_handle(workflow_id(key))

    async def state() -> LinkView:
        view: LinkView = await handle.query(LinkWorkflow.state)
        return view

    await eventually(state, lambda view: view.loaded)
    request = RetireInput(operator="ops@example.com", reason="S-5 who really sent it")
    result = await handle.execute_update(LinkWorkflow.retire, request, id="s5-retire")
    assert result.accepted
    [row] = await stack.pool.fetch(
        "SELECT operator, command, temporal_identity FROM connector_operator_audit "
        "WHERE link_key = $1",
        key,
    )
    assert (row["operator"], row["command"]) == ("ops@example.com", "retire")
    assert row["temporal_identity"] == OPS_LAPTOP
