"""The search attributes of SPEC WF-4 and OPS-1, as typed keys the workflows upsert.

The dev stack registers the same names from `temporal-dev.yaml`; a test keeps
the two equal, and the worker refuses to start when any is missing. The static
ones (a link key's own facts) are set by the starter in the start options, so a
run upserts only what changes (upserts are billed actions, NF-6).
"""

from __future__ import annotations

from typing import Any, Final

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from protocol.messages import LinkView
from protocol.summary import LinkFacts

LINK_KEY: Final = SearchAttributeKey.for_keyword("LinkKey")
CONNECTOR_OWNER_KEY: Final = SearchAttributeKey.for_keyword("ConnectorOwnerKey")
DESTINATION_SLOT_ID: Final = SearchAttributeKey.for_keyword("DestinationSlotId")
SOURCE_OBJECT: Final = SearchAttributeKey.for_keyword("SourceObject")
LINK_STATE: Final = SearchAttributeKey.for_keyword("LinkState")
ATTEMPT_STATUS: Final = SearchAttributeKey.for_keyword("AttemptStatus")
NEEDS_OPERATOR: Final = SearchAttributeKey.for_bool("NeedsOperator")
# OPS-1: find a link by what a support request names.
SOURCE_RECORD_ID: Final = SearchAttributeKey.for_keyword("SourceRecordId")
REMOTE_ID: Final = SearchAttributeKey.for_keyword("RemoteId")
PARK_REASON: Final = SearchAttributeKey.for_keyword("ParkReason")

ALL: Final = (
    LINK_KEY,
    CONNECTOR_OWNER_KEY,
    DESTINATION_SLOT_ID,
    SOURCE_OBJECT,
    LINK_STATE,
    ATTEMPT_STATUS,
    NEEDS_OPERATOR,
    SOURCE_RECORD_ID,
    REMOTE_ID,
    PARK_REASON,
)


def start_attributes(link_key: str, facts: LinkFacts | None) -> TypedSearchAttributes:
    """The static attributes a starter sets in the start options (never upserted again)."""
    pairs: list[SearchAttributePair[Any]] = [SearchAttributePair(LINK_KEY, link_key)]
    if facts is not None:
        pairs += [
            SearchAttributePair(CONNECTOR_OWNER_KEY, facts.connector_owner_key),
            SearchAttributePair(DESTINATION_SLOT_ID, facts.destination_slot_id),
            SearchAttributePair(SOURCE_OBJECT, facts.source_object),
            SearchAttributePair(SOURCE_RECORD_ID, facts.source_record_id),
        ]
    return TypedSearchAttributes(pairs)


def wanted_attributes(
    view: LinkView, parked: bool, reason: str | None
) -> list[tuple[SearchAttributeKey[Any], Any]]:
    """What every attribute should say for `view` (None: unset); the run upserts only the
    ones whose value differs from what the workflow already carries."""
    return [
        (LINK_KEY, view.link_key),
        (CONNECTOR_OWNER_KEY, view.connector_owner_key),
        (DESTINATION_SLOT_ID, view.destination_slot_id),
        (SOURCE_OBJECT, view.source_object),
        (SOURCE_RECORD_ID, view.source_record_id),
        (LINK_STATE, view.link_status.value if view.link_status else None),
        (ATTEMPT_STATUS, view.attempt_status.value if view.attempt_status else None),
        (REMOTE_ID, view.remote_id),
        (PARK_REASON, reason),
        (NEEDS_OPERATOR, parked),
    ]
