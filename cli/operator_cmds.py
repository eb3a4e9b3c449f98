"""Operator actions on a link (SPEC WF-3): `supersede`, `reconcile`, `retire`, `mark-terminal`,
`revalidate-link`.

Each command wakes the link's workflow (signal-with-start, so a closed link gets a
fresh run that reloads from Postgres), waits until its `state` query shows the
loaded link, then runs the update and prints the answer. The update id is
derived from the action, the link, the attempt it targets and the arguments, so
re-running a command after a lost reply returns the first answer instead of
applying twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from typing import Annotated, Any, Final

import asyncpg
import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import FailureError

from activities.wake import link_facts
from cli.database import AsJson, resolve_dsn
from cli.errors import fail
from cli.stack.devconfig import load_dev_config
from protocol.messages import (
    LinkView,
    MarkTerminalInput,
    OperatorInput,
    OperatorResult,
    ReconcileInput,
    RetireInput,
    RevalidateInput,
    SupersedeInput,
)
from protocol.summary import LinkFacts
from worker.client import connect_temporal
from worker.crm import wake_link, workflow_id
from worker.settings import RuntimeSettings
from workflows.link import LinkWorkflow

console = Console()
LOAD_TIMEOUT_S: Final = 30.0

Operator = Annotated[str, typer.Option("--operator", help="who acts (recorded on the row)")]
Reason = Annotated[str, typer.Option("--reason", help="why (recorded on the row)")]
TaskQueue = Annotated[
    str | None,
    typer.Option(
        "--task-queue",
        help="the workers' task queue (default: $CONNECTOR_PUSH_TASK_QUEUE, then connector-push)",
        show_default=False,
    ),
]


class OperatorRefused(Exception):
    """The workflow's validator (or the compare-and-set behind it) refused the action."""


async def _client(settings: RuntimeSettings) -> Client:
    address = settings.temporal_address or load_dev_config().temporal.address
    return await connect_temporal(settings.model_copy(update={"temporal_address": address}))


async def _loaded_view(handle: WorkflowHandle[Any, Any]) -> LinkView:
    """The workflow's view once it has read Postgres (or whatever it shows at the deadline)."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        view = await handle.query(LinkWorkflow.state)
        if view.loaded:
            return view
        if time.monotonic() > deadline:
            return view
        await asyncio.sleep(0.1)


async def _facts(link_key: str) -> LinkFacts | None:
    """The link's facts, for the summary of a run this command may start (OPS-1); best
    effort: without Postgres the run starts with the bare key as its summary."""
    try:
        async with asyncio.timeout(5):
            conn = await asyncpg.connect(resolve_dsn(None))
            try:
                return (await link_facts(conn, [link_key])).get(link_key)
            finally:
                await conn.close()
    except (OSError, TimeoutError, asyncpg.PostgresError):
        return None


def update_id(action: str, link_key: str, view: LinkView, request: BaseModel) -> str:
    """Deterministic per action, link, targeted attempt and arguments (see module doc)."""
    digest = hashlib.sha256(
        json.dumps([view.attempt_id, request.model_dump(mode="json")], sort_keys=True).encode()
    ).hexdigest()[:16]
    return f"{action}/{link_key}/{digest}"


async def run_action(
    update: Any, link_key: str, request: OperatorInput, task_queue: str | None
) -> OperatorResult:
    """Wake, wait for the loaded state, run `update` (a LinkWorkflow update method);
    refusals raise `OperatorRefused`."""
    settings = RuntimeSettings()
    queue = task_queue or settings.task_queue
    client = await _client(settings)
    await wake_link(client, queue, link_key, None, facts=await _facts(link_key))
    handle = client.get_workflow_handle(workflow_id(link_key))
    view = await _loaded_view(handle)
    try:
        result: OperatorResult = await handle.execute_update(
            update, request, id=update_id(update.__name__, link_key, view, request)
        )
    except WorkflowUpdateFailedError as error:
        raise OperatorRefused(_reason(error)) from error
    return result


def _reason(error: WorkflowUpdateFailedError) -> str:
    """The innermost message: the validator's text, or the activity's refusal."""
    failure: BaseException = error.cause
    while isinstance(failure, FailureError) and isinstance(failure.cause, FailureError):
        failure = failure.cause
    return failure.message if isinstance(failure, FailureError) else str(failure)


def _invoke(
    update: Any, link_key: str, request: OperatorInput, task_queue: str | None, as_json: bool
) -> None:
    try:
        result = asyncio.run(run_action(update, link_key, request, task_queue))
    except OperatorRefused as refused:
        fail(escape(f"{update.__name__} refused: {refused}"))
    if as_json:
        console.print_json(result.model_dump_json())
        return
    view = result.view
    console.print(f"[bold]{escape(result.message)}[/]")
    console.print(
        f"link {view.link_status or 'none'} remote id {view.remote_id or '-'}; "
        f"attempt #{view.attempt_ordinal or '-'} {view.attempt_status or 'none'}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    @app.command("supersede")
    def supersede_command(
        link_key: str,
        operator: Operator,
        reason: Reason,
        no_reserve: Annotated[
            bool, typer.Option("--no-reserve", help="do not reserve the next attempt")
        ] = False,
        task_queue: TaskQueue = None,
        as_json: AsJson = False,
    ) -> None:
        """terminal_failed -> superseded, reserving the next attempt unless --no-reserve."""
        request = SupersedeInput(operator=operator, reason=reason, reserve_next=not no_reserve)
        _invoke(LinkWorkflow.supersede, link_key, request, task_queue, as_json)

    @app.command("reconcile")
    def reconcile_command(
        link_key: str,
        remote_id: Annotated[str, typer.Option("--remote-id", help="the proven remote id")],
        evidence: Annotated[str, typer.Option("--evidence", help="how it was proven")],
        operator: Operator,
        reason: Reason,
        task_queue: TaskQueue = None,
        as_json: AsJson = False,
    ) -> None:
        """ambiguous_remote_effect -> finalized link with an operator-proven remote id."""
        request = ReconcileInput(
            operator=operator, reason=reason, remote_id=remote_id, evidence=evidence
        )
        _invoke(LinkWorkflow.reconcile, link_key, request, task_queue, as_json)

    @app.command("retire")
    def retire_command(
        link_key: str,
        operator: Operator,
        reason: Reason,
        task_queue: TaskQueue = None,
        as_json: AsJson = False,
    ) -> None:
        """finalized | suspended_drift -> retired (the remote id is released, ID-4)."""
        request = RetireInput(operator=operator, reason=reason)
        _invoke(LinkWorkflow.retire, link_key, request, task_queue, as_json)

    @app.command("mark-terminal")
    def mark_terminal_command(
        link_key: str,
        operator: Operator,
        reason: Reason,
        task_queue: TaskQueue = None,
        as_json: AsJson = False,
    ) -> None:
        """A pending attempt that provably sent nothing -> terminal_failed."""
        request = MarkTerminalInput(operator=operator, reason=reason)
        _invoke(LinkWorkflow.mark_terminal, link_key, request, task_queue, as_json)

    @app.command("revalidate-link")
    def revalidate_link_command(
        link_key: str,
        reason: Reason,
        operator: Annotated[
            str, typer.Option("--operator", help="who acts (default: $USER)")
        ] = os.environ.get("USER", "operator"),
        task_queue: TaskQueue = None,
        as_json: AsJson = False,
    ) -> None:
        """suspended_drift -> finalized on the active pack's snapshots (mapping fingerprints
        move only through `revalidate apply`, SPEC §9)."""
        request = RevalidateInput(operator=operator, reason=reason)
        _invoke(LinkWorkflow.revalidate, link_key, request, task_queue, as_json)
