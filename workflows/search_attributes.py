"""The search attributes of SPEC WF-4, as typed keys the workflows upsert.

The dev stack registers the same names from `temporal-dev.yaml`; a test keeps
the two equal, and the worker refuses to start when any is missing.
"""

from __future__ import annotations

from typing import Final

from temporalio.common import SearchAttributeKey

LINK_KEY: Final = SearchAttributeKey.for_keyword("LinkKey")
CONNECTOR_OWNER_KEY: Final = SearchAttributeKey.for_keyword("ConnectorOwnerKey")
DESTINATION_SLOT_ID: Final = SearchAttributeKey.for_keyword("DestinationSlotId")
SOURCE_OBJECT: Final = SearchAttributeKey.for_keyword("SourceObject")
LINK_STATE: Final = SearchAttributeKey.for_keyword("LinkState")
ATTEMPT_STATUS: Final = SearchAttributeKey.for_keyword("AttemptStatus")
NEEDS_OPERATOR: Final = SearchAttributeKey.for_bool("NeedsOperator")

ALL: Final = (
    LINK_KEY,
    CONNECTOR_OWNER_KEY,
    DESTINATION_SLOT_ID,
    SOURCE_OBJECT,
    LINK_STATE,
    ATTEMPT_STATUS,
    NEEDS_OPERATOR,
)
