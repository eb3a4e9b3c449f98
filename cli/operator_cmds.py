"""Operator actions on a link (SPEC WF-3): `supersede`, `reconcile`, `retire`, `mark-terminal`,
`revalidate-link`.

Each command first checks the key: its shape (exit 2 if it is not a link key) and
that Postgres has rows for it (exit 2 if none), so a typo never starts a workflow.
Then it wakes the link's workflow (signal-with-start, so a closed link gets a
fresh run that reloads from Postgres), waits until its `state` query shows the
loaded link, then runs the update and prints the answer. The update id is
derived from the action, the link, the attempt it targets and the arguments, so
re-running a command after a lost reply returns the first answer instead of
applying twice.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Annotated, Any, Final, NamedTuple, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from cli.database import AsJson, DatabaseUrl, open_connection, resolve_dsn
from cli.errors import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, CliError, fail, required_text

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from pydantic import BaseModel
    from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

    from protocol.messages import LinkView, OperatorInput, OperatorResult
    from protocol.summary import LinkFacts

console = Console()
LOAD_TIMEOUT_S: Final = 30.0

Operator = Annotated[
    str, typer.Option("--operator", help="who acts (required; recorded on the row)")
]
Reason = Annotated[str, typer.Option("--reason", help="why (recorded on the row)")]
TaskQueue = Annotated[
    str | None,
    typer.Option(
        "--task-queue",
        help="the workers' task queue (default: $CONNECTOR_PUSH_TASK_QUEUE, then connector-push)",
        show_default=False,
    ),
]


class Options(NamedTuple):
    """What every operator command takes besides its action's input."""

    task_queue: str | None
    database_url: str | None
    as_json: bool


class OperatorRefused(Exception):
    """The workflow's validator (or the compare-and-set behind it) refused the action."""


def check_key_shape(link_key: str) -> None:
    """Exit 2 before any connection when `link_key` cannot be a link key."""
    from protocol.identity import is_link_key

    if not is_link_key(link_key):
        raise CliError(
            f"{link_key!r} is not a link key (lk1_ and 64 hex digits): find it with "
            "`connector-push links list` or compute it with `connector-push link-key`",
            EXIT_BAD_INPUT,
        )


async def check_key_has_rows(dsn: str, link_key: str) -> LinkFacts | None:
    """Exit 2 when Postgres has no link and no attempt for `link_key` (nothing is woken);
    else the link's facts, for the summary of a run this command may start (OPS-1)."""
    from db.link_rows import link_key_known
    from services.wake import link_facts

    async with open_connection(dsn) as conn:
        known = await link_key_known(conn, link_key)
        facts = (await link_facts(conn, [link_key])).get(link_key) if known else None
    if not known:
        raise CliError(
            f"no link or attempt has key {link_key}; nothing was started "
            "(check DATABASE_URL points at the right database; `connector-push links list`)",
            EXIT_BAD_INPUT,
        )
    return facts


async def _loaded_view(handle: WorkflowHandle[Any, Any]) -> LinkView:
    """The workflow's view once it has read Postgres (or whatever it shows at the deadline)."""
    import asyncio

    from workflows.link import LinkWorkflow

    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        view = await handle.query(LinkWorkflow.state)
        if view.loaded:
            return view
        if time.monotonic() > deadline:
            return view
        await asyncio.sleep(0.1)


def update_id(action: str, link_key: str, view: LinkView, request: BaseModel) -> str:
    """Deterministic per action, link, targeted attempt and arguments (see module doc)."""
    digest = hashlib.sha256(
        json.dumps([view.attempt_id, request.model_dump(mode="json")], sort_keys=True).encode()
    ).hexdigest()[:16]
    return f"{action}/{link_key}/{digest}"


async def run_action(
    update: Any, link_key: str, request: OperatorInput, task_queue: str | None, dsn: str
) -> OperatorResult:
    """Check the key has rows, wake, wait for the loaded state, run `update` (a LinkWorkflow
    update method); refusals raise `OperatorRefused`."""
    from cli.entry import runtime_settings, temporal_client
    from worker.crm import wake_link

    settings = runtime_settings()
    facts = await check_key_has_rows(dsn, link_key)
    queue = task_queue or settings.task_queue
    async with temporal_client(settings) as client:
        await wake_link(client, queue, link_key, None, facts=facts, for_operator=True)
        return await _update(client, update, link_key, request)


async def _update(
    client: Client, update: Any, link_key: str, request: OperatorInput
) -> OperatorResult:
    from temporalio.client import WorkflowUpdateFailedError

    from worker.crm import workflow_id

    handle = client.get_workflow_handle(workflow_id(link_key))
    view = await _loaded_view(handle)
    try:
        result: OperatorResult = await handle.execute_update(
            update, request, id=update_id(update.__name__, link_key, view, request)
        )
    except WorkflowUpdateFailedError as error:
        raise OperatorRefused(_reason(error).replace("KEY", link_key)) from error
    return result


def _reason(error: WorkflowUpdateFailedError) -> str:
    """The innermost message: the validator's text, or the activity's refusal."""
    from temporalio.exceptions import FailureError

    failure: BaseException = error.cause
    while isinstance(failure, FailureError) and isinstance(failure.cause, FailureError):
        failure = failure.cause
    return failure.message if isinstance(failure, FailureError) else str(failure)


def _invoke(
    update: Any,
    link_key: str,
    request: OperatorInput,
    options: Options,
) -> None:
    from temporalio.client import RPCTimeoutOrCancelledError
    from temporalio.service import RPCError

    from cli.entry import run_closing_temporal

    task_queue, database_url, as_json = options
    check_key_shape(link_key)
    dsn = resolve_dsn(database_url)
    try:
        result = run_closing_temporal(run_action(update, link_key, request, task_queue, dsn))
    except OperatorRefused as refused:
        fail(escape(f"{update.__name__} refused: {refused}"))
    except (RPCError, RPCTimeoutOrCancelledError) as error:
        raise _unanswered(update.__name__, link_key, error) from None
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


def _unanswered(action: str, link_key: str, error: Exception) -> CliError:
    """Temporal failed a call after the connect (restarting, overloaded, no answer in time):
    exit 5, one line. The update id is deterministic, so the same command run again returns
    the first answer if this one was applied (module doc)."""
    from temporalio.service import RPCError

    status = error.status.name if isinstance(error, RPCError) else "TIMEOUT"
    detail = " ".join(str(error).split()) or type(error).__name__
    return CliError(
        f"Temporal did not finish {action} on {link_key} ({status}: {detail}); it may or may "
        "not have been applied: run the same command again (it is applied at most once) or "
        f"see `connector-push links show {link_key}`",
        EXIT_UNAVAILABLE,
    )


_M = TypeVar("_M", bound="BaseModel")


def _request(model: type[_M], **fields: object) -> _M:
    """The operator action's input, or exit 2 naming the option and its rule (nothing is
    started or written: this runs before any connection)."""
    from pydantic import ValidationError

    for name, value in fields.items():
        if isinstance(value, str):
            required_text(_option(name), value)
    try:
        return model.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        option = _option(str(first["loc"][0])) if first["loc"] else model.__name__
        raise CliError(f"{option}: {first['msg']}", EXIT_BAD_INPUT) from None


def _option(field: str) -> str:
    return "--" + field.replace("_", "-")


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
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """terminal_failed -> superseded, reserving the next attempt unless --no-reserve.

        Refused (exit 1) for an attempt any try of which may have landed (SPEC §15 C-1):
        a new attempt could create a second object; find it and run `reconcile`."""
        from protocol.messages import SupersedeInput
        from workflows.link import LinkWorkflow

        request = _request(
            SupersedeInput, operator=operator, reason=reason, reserve_next=not no_reserve
        )
        _invoke(
            LinkWorkflow.supersede, link_key, request, Options(task_queue, database_url, as_json)
        )

    @app.command("reconcile")
    def reconcile_command(
        link_key: str,
        remote_id: Annotated[str, typer.Option("--remote-id", help="the proven remote id")],
        evidence: Annotated[str, typer.Option("--evidence", help="how it was proven")],
        operator: Operator,
        reason: Reason,
        task_queue: TaskQueue = None,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """ambiguous_remote_effect -> finalized link with an operator-proven remote id."""
        from protocol.messages import ReconcileInput
        from protocol.remote_ids import RemoteIdError, check_remote_id
        from workflows.link import LinkWorkflow

        try:  # PROF-4 here, not only in the activity: nothing is woken for a bad id
            check_remote_id(remote_id)
        except RemoteIdError as error:
            raise CliError(f"--remote-id: {error}", EXIT_BAD_INPUT) from None
        request = _request(
            ReconcileInput, operator=operator, reason=reason, remote_id=remote_id, evidence=evidence
        )
        _invoke(
            LinkWorkflow.reconcile, link_key, request, Options(task_queue, database_url, as_json)
        )

    @app.command("retire")
    def retire_command(
        link_key: str,
        operator: Operator,
        reason: Reason,
        task_queue: TaskQueue = None,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """finalized | suspended_drift -> retired (the remote id is released, ID-4)."""
        from protocol.messages import RetireInput
        from workflows.link import LinkWorkflow

        request = _request(RetireInput, operator=operator, reason=reason)
        _invoke(LinkWorkflow.retire, link_key, request, Options(task_queue, database_url, as_json))

    @app.command("mark-terminal")
    def mark_terminal_command(
        link_key: str,
        operator: Operator,
        reason: Reason,
        task_queue: TaskQueue = None,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """A pending attempt that provably sent nothing -> terminal_failed."""
        from protocol.messages import MarkTerminalInput
        from workflows.link import LinkWorkflow

        request = _request(MarkTerminalInput, operator=operator, reason=reason)
        options = Options(task_queue, database_url, as_json)
        _invoke(LinkWorkflow.mark_terminal, link_key, request, options)

    @app.command("revalidate-link")
    def revalidate_link_command(
        link_key: str,
        operator: Operator,
        reason: Reason,
        task_queue: TaskQueue = None,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """suspended_drift -> finalized on the active pack's snapshots (mapping fingerprints
        move only through `revalidate apply`, SPEC §9)."""
        from protocol.messages import RevalidateInput
        from workflows.link import LinkWorkflow

        request = _request(RevalidateInput, operator=operator, reason=reason)
        _invoke(
            LinkWorkflow.revalidate, link_key, request, Options(task_queue, database_url, as_json)
        )
