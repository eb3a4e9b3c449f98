"""Transport-neutral answers and HubSpot-shaped error bodies."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import JsonValue


@dataclass(frozen=True)
class Reply:
    """An HTTP answer before it becomes a Starlette response (`body=None` means no body)."""

    status: int
    body: JsonValue = None
    headers: Mapping[str, str] = field(default_factory=dict)


class Rejected(Exception):
    """Raised inside request handling to answer with `reply` and stop."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def error(status: int, category: str, message: str) -> Reply:
    """A HubSpot-style error body: `{"status": "error", "message", "category"}`."""
    return Reply(status, {"status": "error", "message": message, "category": category})


def sha256_hex(raw: bytes) -> str:
    """Hex SHA-256 of the raw request body bytes."""
    return hashlib.sha256(raw).hexdigest()


def parse_json_object(raw: bytes) -> dict[str, JsonValue]:
    """Decode a request body that must be a JSON object, or reject it with a 400."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise Rejected(error(400, "VALIDATION_ERROR", f"Invalid input JSON: {exc}")) from exc
    if not isinstance(doc, dict):
        raise Rejected(error(400, "VALIDATION_ERROR", "Request body must be a JSON object"))
    return doc
