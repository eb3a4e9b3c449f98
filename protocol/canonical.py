"""Canonical JSON and sha256 digests: the one way protocol hashes structured values."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, JsonValue


def canonical_json(value: JsonValue) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8, NaN rejected."""
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: JsonValue) -> str:
    """sha256 hex of the canonical JSON of `value`."""
    return sha256_hex(canonical_json(value))


def model_digest(model: BaseModel, *, exclude: set[str] | None = None) -> str:
    """Digest of a model's JSON form under its aliases (the manifest's spelling)."""
    return digest(model.model_dump(mode="json", by_alias=True, exclude=exclude))
