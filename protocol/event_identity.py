"""Event identity (SPEC ING-5): versioned, typed, length-framed sha256 composites.

Rules kept in this module:
1. An identity is sha256 over a domain tag naming its kind and version, then each
   part framed as one type byte, a 4-byte big-endian length and the part's bytes.
   The first part is always the endpoint scope, so endpoints never collide.
2. Numbers are exact decimals read from the JSON text and canonicalised, so equal
   values (`1`, `1.0`, `1e0`) have one encoding; a float never enters a hash.
3. The business identity omits the delivery attempt counter; the receipt identity
   is the same parts plus the attempt, under its own domain tag. A retry therefore
   keeps its event and gets a new receipt.
4. A missing required part, a value of the wrong JSON type, or text that is not
   encodable (a lone surrogate) is an `IdentityError`: an event that cannot be
   identified is rejected, never guessed; callers catch that one error only.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Annotated, Final, Literal, NewType

from pydantic import BaseModel, ConfigDict, Field

EventId = NewType("EventId", str)
ReceiptId = NewType("ReceiptId", str)

COMPOSITE_EVENT_DOMAIN: Final = b"connector-push/event-identity/v1\x00"
COMPOSITE_RECEIPT_DOMAIN: Final = b"connector-push/receipt-identity/v1\x00"
LEGACY_EVENT_DOMAIN: Final = b"connector-push/event-identity/legacy-v1\x00"
LEGACY_RECEIPT_DOMAIN: Final = b"connector-push/receipt-identity/legacy-v1\x00"

EVENT_PREFIX: Final = "ev1_"
RECEIPT_PREFIX: Final = "rc1_"
LEGACY_EVENT_PREFIX: Final = "evl1_"
LEGACY_RECEIPT_PREFIX: Final = "rcl1_"


class IdentityError(ValueError):
    """An event whose identity cannot be computed under its rule."""


class PartType(StrEnum):
    STRING = "string"
    NUMBER = "number"
    BOOLEAN = "boolean"


# One type byte per framed part; ABSENT marks an optional field that is missing.
_TYPE_TAG: Final[Mapping[PartType, bytes]] = {
    PartType.STRING: b"s",
    PartType.NUMBER: b"n",
    PartType.BOOLEAN: b"b",
}
_ABSENT_TAG: Final = b"0"


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IdentityField(_Rule):
    """One ordered part: a dotted path into the event and the JSON type it must have."""

    path: Annotated[str, Field(min_length=1)]
    type: PartType
    optional: bool = False


class CompositeIdentityRule(_Rule):
    kind: Literal["composite"] = "composite"
    fields: Annotated[tuple[IdentityField, ...], Field(min_length=1)]
    # The delivery attempt counter: in the receipt identity only.
    attempt_path: str | None = None


class LegacyIdentityRule(_Rule):
    """The single-path rule (e.g. `.callbackId`), kept compatible."""

    kind: Literal["legacy"] = "legacy"
    path: Annotated[str, Field(min_length=1)]
    attempt_path: str | None = None


IdentityRule = Annotated[CompositeIdentityRule | LegacyIdentityRule, Field(discriminator="kind")]


class _Missing:
    pass


MISSING: Final = _Missing()


def canonical_decimal(value: Decimal) -> str:
    """Exact canonical text of a finite decimal: `[-]digits e exponent`, no trailing zeros.

    Done on the exact digits rather than `normalize()`, which rounds to the context
    precision and would make distinct long numbers equal. The digits and exponent
    are read from `str(value)`, which is exact (every digit of the coefficient, the
    exponent in scientific form or as the position of the point); it is the same
    result as reading `as_tuple()`, at a fraction of the cost.
    """
    if not value.is_finite():
        raise IdentityError("non-finite number")
    text = str(value)
    if text.isdigit():  # a non-negative integer with exponent 0, the common case
        digits = text.lstrip("0")
        if not digits:
            return "0"
        stripped = digits.rstrip("0")
        return f"{stripped}e{len(digits) - len(stripped)}"
    negative = text.startswith("-")
    mantissa, _, exponent_text = text.lstrip("-").partition("E")
    exponent = int(exponent_text) if exponent_text else 0
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return "0"
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped) - len(fraction)
    return f"{'-' if negative else ''}{stripped}e{exponent}"


@functools.lru_cache(maxsize=1024)
def _path_keys(path: str) -> tuple[str, ...]:
    return tuple(path.removeprefix(".").split("."))


def lookup(event: object, path: str) -> object:
    """The value at a dotted path (a leading `.` is allowed), or `MISSING`."""
    current = event
    for key in _path_keys(path):
        # `type(...) is dict` first: the parsed JSON case, without the ABC check.
        if not (type(current) is dict or isinstance(current, Mapping)) or key not in current:
            return MISSING
        current = current[key]
    return current


def _utf8(value: str, path: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (`\\ud800`): never a hashable part
        raise IdentityError(f"identity part {path!r} is not encodable text") from None


def _typed_bytes(part_type: PartType, value: object, path: str) -> bytes:
    match part_type:
        case PartType.STRING if isinstance(value, str):
            return _utf8(value, path)
        case PartType.BOOLEAN if isinstance(value, bool):
            return b"true" if value else b"false"
        case PartType.NUMBER if isinstance(value, Decimal):
            return canonical_decimal(value).encode("ascii")
        case PartType.NUMBER if isinstance(value, int) and not isinstance(value, bool):
            return canonical_decimal(Decimal(value)).encode("ascii")
    raise IdentityError(f"identity part {path!r} is not a JSON {part_type.value}")


def _frame(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(4, "big") + payload


def _field_frame(field: IdentityField, event: object) -> bytes:
    value = lookup(event, field.path)
    if value is MISSING or value is None:
        if field.optional:
            return _frame(_ABSENT_TAG, b"")
        raise IdentityError(f"identity part {field.path!r} is missing")
    return _frame(_TYPE_TAG[field.type], _typed_bytes(field.type, value, field.path))


def _scalar_frame(value: object, path: str) -> bytes:
    """A legacy part: typed by its own JSON type (string or number)."""
    if isinstance(value, str):
        return _frame(_TYPE_TAG[PartType.STRING], _utf8(value, path))
    if isinstance(value, Decimal | int) and not isinstance(value, bool):
        return _frame(_TYPE_TAG[PartType.NUMBER], _typed_bytes(PartType.NUMBER, value, path))
    raise IdentityError(f"identity part {path!r} is missing or not a string or number")


def _attempt_frame(attempt_path: str | None, event: object) -> bytes:
    """An optional number part (`_field_frame` of an optional NUMBER field)."""
    if attempt_path is None:
        return _frame(_ABSENT_TAG, b"")
    value = lookup(event, attempt_path)
    if value is MISSING or value is None:
        return _frame(_ABSENT_TAG, b"")
    return _frame(_TYPE_TAG[PartType.NUMBER], _typed_bytes(PartType.NUMBER, value, attempt_path))


def _digest(domain: bytes, scope: str, frames: Iterable[bytes]) -> str:
    if not scope:
        raise IdentityError("identity scope is empty")
    encoded = scope.encode("utf-8")
    # One update of the same byte string the separate frames made.
    hasher = hashlib.sha256(domain)
    hasher.update(b"".join([_frame(_TYPE_TAG[PartType.STRING], encoded), *frames]))
    return hasher.hexdigest()


# A composite rule's fields, resolved once: (path keys, path, type, its tag, optional).
_CompiledField = tuple[tuple[str, ...], str, PartType, bytes, bool]
_compiled: dict[int, tuple[CompositeIdentityRule, tuple[_CompiledField, ...]]] = {}


def _compile(rule: CompositeIdentityRule) -> tuple[_CompiledField, ...]:
    entry = _compiled.get(id(rule))
    if entry is not None and entry[0] is rule:
        return entry[1]
    fields = tuple(
        (_path_keys(f.path), f.path, f.type, _TYPE_TAG[f.type], f.optional) for f in rule.fields
    )
    if len(_compiled) >= 1024:  # rules live as long as the policy: this never churns
        _compiled.clear()
    _compiled[id(rule)] = (rule, fields)  # the rule is kept, so its id is not reused
    return fields


_ABSENT_FRAME: Final = _frame(_ABSENT_TAG, b"")


def _composite_frames(rule: CompositeIdentityRule, event: object) -> list[bytes]:
    """`[_field_frame(field, event) for field in rule.fields]`, with the rule resolved once."""
    frames = []
    for keys, path, part_type, tag, optional in _compile(rule):
        value = event
        for key in keys:
            if not (type(value) is dict or isinstance(value, Mapping)) or key not in value:
                value = MISSING
                break
            value = value[key]
        if value is MISSING or value is None:
            if optional:
                frames.append(_ABSENT_FRAME)
                continue
            raise IdentityError(f"identity part {path!r} is missing")
        payload = _typed_bytes(part_type, value, path)
        frames.append(tag + len(payload).to_bytes(4, "big") + payload)
    return frames


def _business_frames(
    rule: CompositeIdentityRule | LegacyIdentityRule, event: object
) -> list[bytes]:
    if isinstance(rule, LegacyIdentityRule):
        return [_scalar_frame(lookup(event, rule.path), rule.path)]
    return _composite_frames(rule, event)


def business_identity(
    rule: CompositeIdentityRule | LegacyIdentityRule, scope: str, event: object
) -> EventId:
    """The event's business identity: the same across delivery retries."""
    return _business_identity(rule, scope, _business_frames(rule, event))


def receipt_identity(
    rule: CompositeIdentityRule | LegacyIdentityRule, scope: str, event: object
) -> ReceiptId:
    """The transport receipt identity: business parts plus the attempt counter."""
    return _receipt_identity(rule, scope, _business_frames(rule, event), event)


def identities(
    rule: CompositeIdentityRule | LegacyIdentityRule, scope: str, event: object
) -> tuple[EventId, ReceiptId]:
    """`business_identity` and `receipt_identity` together, reading the event's parts once."""
    frames = _business_frames(rule, event)
    return _business_identity(rule, scope, frames), _receipt_identity(rule, scope, frames, event)


def _business_identity(
    rule: CompositeIdentityRule | LegacyIdentityRule, scope: str, frames: list[bytes]
) -> EventId:
    if isinstance(rule, LegacyIdentityRule):
        return EventId(LEGACY_EVENT_PREFIX + _digest(LEGACY_EVENT_DOMAIN, scope, frames))
    return EventId(EVENT_PREFIX + _digest(COMPOSITE_EVENT_DOMAIN, scope, frames))


def _receipt_identity(
    rule: CompositeIdentityRule | LegacyIdentityRule,
    scope: str,
    business_frames: list[bytes],
    event: object,
) -> ReceiptId:
    frames = [*business_frames, _attempt_frame(rule.attempt_path, event)]
    if isinstance(rule, LegacyIdentityRule):
        return ReceiptId(LEGACY_RECEIPT_PREFIX + _digest(LEGACY_RECEIPT_DOMAIN, scope, frames))
    return ReceiptId(RECEIPT_PREFIX + _digest(COMPOSITE_RECEIPT_DOMAIN, scope, frames))


# --- exact JSON -----------------------------------------------------------------


class JsonError(ValueError):
    """A body that is not exactly one well-formed UTF-8 JSON document."""


def _reject_constant(name: str) -> object:
    raise JsonError(f"non-standard JSON constant {name}")


def _unique_keys(pairs: Sequence[tuple[str, object]]) -> dict[str, object]:
    # Duplicate keys would make "the value at a path" ambiguous for identity.
    result = dict(pairs)
    if len(result) != len(pairs):
        raise JsonError("duplicate object key")
    return result


def parse_exact_json(raw: bytes) -> object:
    """Parse UTF-8 JSON with every number as an exact `Decimal`."""
    try:
        text = raw.decode("utf-8")
        return json.loads(
            text,
            parse_float=Decimal,
            parse_int=Decimal,
            parse_constant=_reject_constant,
            object_pairs_hook=_unique_keys,
        )
    except (UnicodeDecodeError, ValueError, InvalidOperation, RecursionError) as exc:
        raise JsonError(str(exc) if isinstance(exc, JsonError) else "malformed JSON") from None


# What `json.dumps(text, ensure_ascii=False)` calls for a `str` (minus its per-call
# encoder construction): the same bytes.
_encode_string: Final[Callable[[str], str]] = json.encoder.encode_basestring


def dump_exact_json(value: object) -> str:
    """Serialise a value from `parse_exact_json` without passing numbers through float."""
    if type(value) is str:
        return _encode_string(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        items = (
            f"{_encode_string(k) if type(k) is str else json.dumps(k, ensure_ascii=False)}:"
            f"{dump_exact_json(v)}"
            for k, v in value.items()
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump_exact_json(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)
