"""Remote-deletion evidence (SPEC G-8): what is recorded, and what it refuses.

A deletion event is recorded whatever the state of the links naming its object, even
with no link at all, keyed by the remote object: target object, remote scope and
remote id. Tying a link to a deleted object again (reconcile, revalidate) is refused
while such a record exists; the refusal names the event so the operator can check it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict

from protocol.inbound import EventView
from protocol.ingress_policy import InboundHandler


class RemoteDeletion(BaseModel):
    """One recorded deletion event of a remote object (a row of migration 0180)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str
    target_object: str
    remote_scope: str
    remote_id: str
    event_type: str
    endpoint: str
    recorded_at: datetime


def records_remote_deletion(event: EventView) -> bool:
    """True when settling `event` records a deletion: a deletion whose object is fully
    named. An unmapped remote scope names no object of ours (ING-6 suspends nothing for
    it either), so nothing is recorded."""
    return (
        event.handler == InboundHandler.REMOTE_DELETION.value
        and bool(event.target_object)
        and bool(event.remote_object_id)
        and event.remote_scope is not None
    )


# What works instead, by the refused action (a dict, so a new verb is a key error in tests).
DELETED_OBJECT_REMEDY: Final = {
    "reconciled": (
        "reconcile to the id of the object the create made if it is another one; otherwise"
        " the way forward is the migration policy (SPEC §10: retire, or a declared rebind)"
    ),
    "revalidated": "retire the link instead",
}


def deletion_fact(deletion: RemoteDeletion) -> str:
    """What was deleted, and the event that says so."""
    return (
        f"{deletion.target_object} {deletion.remote_id} in {deletion.remote_scope}"
        f" was deleted at the remote (event {deletion.event_id} on {deletion.endpoint}, recorded"
        f" {deletion.recorded_at.isoformat(timespec='seconds')}; G-8)"
    )


def deleted_object_refusal(verb: str, deletion: RemoteDeletion) -> str:
    """One line: why `verb` refuses to tie a link to an object reported deleted."""
    return f"not {verb}: {deletion_fact(deletion)}: {DELETED_OBJECT_REMEDY[verb]}; nothing changed"
