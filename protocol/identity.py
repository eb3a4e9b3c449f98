"""Link identity (SPEC ID-2): the durable owner key of one logical push."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Final

from pydantic import BaseModel, ConfigDict, model_validator

ACTION_TYPE: Final = "PushToConnector"
# The LinkWorkflow's type name: callers that may not import `workflows/` start it by
# name (a test keeps it equal to the class).
LINK_WORKFLOW_TYPE: Final = "LinkWorkflow"
LINK_KEY_PREFIX: Final = "lk1_"
LINK_KEY_DOMAIN: Final = b"connector-push/link-key/v1\x00"

# Categories rejected inside a part: control characters and lone surrogates
# (the latter cannot be encoded as UTF-8 at all).
_FORBIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cs"})


# The control characters of ASCII (Unicode category Cc there; ASCII has no Cf, Cs, Co or
# Cn character): an ASCII value, nearly every id, is checked by one regex search instead
# of a category lookup per character (a backfill computes two link keys per record).
_ASCII_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def has_control_character(value: str, categories: frozenset[str]) -> bool:
    """Whether any character of `value` is in one of the Unicode `categories` (a subset
    of the C* categories, Cc among them)."""
    if value.isascii():
        return _ASCII_CONTROL.search(value) is not None
    return any(unicodedata.category(ch) in categories for ch in value)


class InvalidIdentityPart(ValueError):
    """One identity part is empty, padded with whitespace or holds control characters."""

    def __init__(self, part: str, problem: str) -> None:
        super().__init__(f"{part}: {problem}")
        self.part = part
        self.problem = problem


def check_part(part: str, value: str) -> str:
    """Return `value` unchanged, or raise `InvalidIdentityPart` naming `part`."""
    if not value:
        raise InvalidIdentityPart(part, "must not be empty")
    if value != value.strip():
        raise InvalidIdentityPart(part, "must not have leading or trailing whitespace")
    if has_control_character(value, _FORBIDDEN_CATEGORIES):
        raise InvalidIdentityPart(part, "must not contain control characters")
    return value


def hash_parts(domain: bytes, parts: tuple[str, ...]) -> str:
    """sha256 hex over `domain` and each part as 4-byte big-endian length + UTF-8 bytes."""
    digest = hashlib.sha256(domain)
    for part in parts:
        raw = part.encode("utf-8")
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
    return digest.hexdigest()


def link_key(
    owner_key: str,
    action_slot_id: str,
    source_object: str,
    source_record_id: str,
    destination_slot_id: str,
) -> str:
    """The ID-2 link key; raises `InvalidIdentityPart` on a malformed part."""
    parts = (
        check_part("ConnectorOwnerKey", owner_key),
        check_part("ActionSlotId", action_slot_id),
        ACTION_TYPE,
        check_part("SourceObject", source_object),
        check_part("SourceRecordId", source_record_id),
        check_part("DestinationSlotId", destination_slot_id),
    )
    return LINK_KEY_PREFIX + hash_parts(LINK_KEY_DOMAIN, parts)


class LinkIdentity(BaseModel):
    """The stable parts of one link; `.key` is its ID-2 link key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connector_owner_key: str
    action_slot_id: str
    source_object: str
    source_record_id: str
    destination_slot_id: str

    @model_validator(mode="after")
    def _parts_are_valid(self) -> LinkIdentity:
        self.key  # noqa: B018 - validates every part
        return self

    @property
    def key(self) -> str:
        return link_key(
            self.connector_owner_key,
            self.action_slot_id,
            self.source_object,
            self.source_record_id,
            self.destination_slot_id,
        )


def is_link_key(value: str) -> bool:
    """Whether `value` has the ID-2 link key's shape: `lk1_` and 64 lowercase hex digits."""
    digest = value.removeprefix(LINK_KEY_PREFIX)
    return (
        value.startswith(LINK_KEY_PREFIX)
        and len(digest) == 64
        and all(ch in "0123456789abcdef" for ch in digest)
    )


def link_workflow_id(key: str) -> str:
    """WF-1: one workflow per link key."""
    return f"link/{key}"
