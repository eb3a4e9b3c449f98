"""`connector-push link-key`: compute the ID-2 link key operators use to find a workflow."""

from __future__ import annotations

import json
from typing import Annotated

import typer

_EXIT_BAD_INPUT = 2


def link_key_command(
    owner_key: Annotated[str, typer.Option("--owner-key", help="ConnectorOwnerKey.")],
    action_slot: Annotated[str, typer.Option("--action-slot", help="ActionSlotId.")],
    source_object: Annotated[str, typer.Option("--source-object", help="SourceObject.")],
    record_id: Annotated[str, typer.Option("--record-id", help="SourceRecordId.")],
    destination_slot: Annotated[str, typer.Option("--destination-slot", help="DestinationSlotId.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the parts and key as JSON.")
    ] = False,
) -> None:
    """Print the link key of one (owner, action slot, record, destination slot)."""
    from protocol.identity import InvalidIdentityPart, LinkIdentity, link_workflow_id

    try:
        identity = LinkIdentity.model_construct(
            connector_owner_key=owner_key,
            action_slot_id=action_slot,
            source_object=source_object,
            source_record_id=record_id,
            destination_slot_id=destination_slot,
        )
        key = identity.key
    except InvalidIdentityPart as error:
        typer.echo(f"error: invalid {error.part}: {error.problem}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT) from None
    if as_json:
        typer.echo(
            json.dumps(
                {**identity.model_dump(), "link_key": key, "workflow_id": link_workflow_id(key)}
            )
        )
    else:
        typer.echo(key)


def register(app: typer.Typer) -> None:
    app.command("link-key")(link_key_command)
