"""The operator audit trail (SPEC OPS-2): one value per operator action.

An entry says who acted, why, with which command and arguments, and the durable
state before and after. Entries are built here (pure) and appended by the action
in its own transaction (db/audit.py); nothing ever changes or deletes one.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, JsonValue


class AuditCommand(StrEnum):
    """The CLI command an entry records (`connector-push <command>`)."""

    RECONCILE = "reconcile"
    SUPERSEDE = "supersede"
    RETIRE = "retire"
    MARK_TERMINAL = "mark-terminal"
    REVALIDATE_LINK = "revalidate-link"
    REVALIDATE_APPLY = "revalidate-apply"
    BACKFILL_APPLY = "backfill-apply"
    PACK_APPLY = "pack-apply"
    REVALIDATE_OWNER = "revalidate-owner"  # C-4: an owner's install-change suspensions lifted
    REVALIDATE_CREATE_PATH = "revalidate-create-path"  # C-8: a changed createPath validated
    PRUNE = "prune"  # G-8: retention (OPS-3), by the CLI or the worker's schedule
    FORGET = "forget"  # S-7: a record's values erased


# protocol/operator.py OperatorAction value -> the command an operator typed.
OPERATOR_ACTION_COMMANDS: dict[str, AuditCommand] = {
    "reconcile": AuditCommand.RECONCILE,
    "supersede": AuditCommand.SUPERSEDE,
    "retire": AuditCommand.RETIRE,
    "mark_terminal": AuditCommand.MARK_TERMINAL,
    "revalidate": AuditCommand.REVALIDATE_LINK,
}


class AuditEntry(BaseModel):
    """One row to append (`recorded_at` and `audit_id` are the database's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operator: str = Field(min_length=1)
    reason: str
    command: AuditCommand
    link_key: str | None = None
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    state_before: JsonValue = None
    state_after: JsonValue = None
    outcome: str
    # S-5, beside the declared `operator`: what the acting process knows. `host` is its
    # host name (the database layer fills it when left out); `temporal_identity` is the
    # client identity the Temporal server recorded for the update that carried the action.
    host: str | None = None
    temporal_identity: str | None = None


class AuditRecord(AuditEntry):
    """A stored entry, as `connector-push audit` lists it."""

    audit_id: int
    recorded_at: datetime
    # S-5: what Postgres knew of the writer (filled by the database, never by the caller;
    # null on entries older than migration 0225).
    db_role: str | None = None
    db_session_user: str | None = None
    db_client_addr: str | None = None
