"""What a person reads first about a link: its facts and one summary line (SPEC OPS-1).

Every start path of a LinkWorkflow (CRM entry, relay, remote evidence, operator
commands) starts it with this summary and these facts as its static search
attributes, so the UI's list names the record, destination and action.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from protocol.admission import SaveRequest


class LinkFacts(BaseModel):
    """The immutable facts of a link key (ID-2's parts): known to every starter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    link_key: str
    connector_owner_key: str
    action_slot_id: str
    destination_slot_id: str
    source_object: str
    source_record_id: str


def facts_of_save(link_key: str, save: SaveRequest) -> LinkFacts:
    return LinkFacts(
        link_key=link_key,
        connector_owner_key=save.connector_owner_key,
        action_slot_id=save.action_slot_id,
        destination_slot_id=save.destination_slot_id,
        source_object=save.source_object,
        source_record_id=save.source_record_id,
    )


def link_summary(facts: LinkFacts | None, link_key: str) -> str:
    """ "Account a-001 → remote-companies via push-company (demo-owner)"; the bare key when
    the starter does not know the facts."""
    if facts is None:
        return f"link {link_key}"
    return (
        f"{facts.source_object} {facts.source_record_id} → {facts.destination_slot_id}"
        f" via {facts.action_slot_id} ({facts.connector_owner_key})"
    )


def link_details(facts: LinkFacts | None, link_key: str) -> str:
    """The static details (markdown): what the link is and where its evidence lives; the
    current state and the remedy are the workflow's current details."""
    lines = [f"**link key** `{link_key}`"]
    if facts is not None:
        lines += [
            f"**record** {facts.source_object} `{facts.source_record_id}`",
            f"**action slot** `{facts.action_slot_id}` → **destination slot**"
            f" `{facts.destination_slot_id}` (owner `{facts.connector_owner_key}`)",
        ]
    lines.append(
        f"**everything Postgres holds**: `connector-push links show {link_key}`"
        " (attempts, frozen requests, send journal, PATCHes, drift, operator actions)"
    )
    lines.append("**current state and what to do**: Current Details")
    return "\n\n".join(lines)
