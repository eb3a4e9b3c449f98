"""Canonical JSON and sha256 digests: the one way protocol hashes structured values."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from json.encoder import encode_basestring

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


# -- canonical JSON of an object, a member at a time -------------------------------------
# `canonical_json` of an object is "{", its members `"key":value` sorted by key and joined
# by ",", then "}"; a string is written by json's own `encode_basestring`, the function
# json.dumps(ensure_ascii=False) writes every string with. Two objects that differ in a few
# members (a link row before and after a revalidation) then share the encoding of the
# rest: a bulk revalidation digests each row twice (bench P4). Tests hold
# `join_members(object_members(v))` to `canonical_json(v)` for any JSON object.


def value_text(value: JsonValue) -> str:
    """`canonical_json(value)` as text."""
    if isinstance(value, str):
        return encode_basestring(value)
    if value is None:
        return "null"
    return canonical_json(value).decode("utf-8")


def member_text(key: str, value_json: str) -> str:
    """One object member, `"key":value`, its value already canonical JSON text."""
    return f"{encode_basestring(key)}:{value_json}"


def object_members(value: Mapping[str, JsonValue]) -> dict[str, str]:
    """Each member of the JSON object `value` as `canonical_json` writes it, by key."""
    return {key: member_text(key, value_text(item)) for key, item in value.items()}


def join_members(members: Mapping[str, str]) -> str:
    """The canonical JSON text of the object whose `object_members` these are."""
    return "{" + ",".join(members[key] for key in sorted(members)) + "}"
