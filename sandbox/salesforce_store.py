"""The salesforce mode's records: flat bodies, 18-character ids, external-id look-ups.

Answers follow Salesforce's REST API: a create is `201 {"id", "success": true,
"errors": []}`, an update `204` with no body, an error a JSON array of
`{"message", "errorCode", "fields"}`. A look-up by an external-id field answers 404
when no record holds the value and 300 (the matching records' URLs) when several do;
a unique external id refuses a second record with `DUPLICATE_VALUE`. Field names are
compared exactly (Salesforce ignores their case; the sandbox does not pretend to).
"""

from __future__ import annotations

import json

from pydantic import JsonValue

from sandbox.config import ObjectTypeConfig, SandboxConfig
from sandbox.holder import StateHolder, now_iso
from sandbox.ledger import append_entry
from sandbox.replies import Rejected, Reply
from sandbox.state import LedgerKind, SalesforceRecord

Fields = dict[str, JsonValue]

# Key prefixes of standard objects; every other type gets a custom object's.
_KEY_PREFIXES = {"Account": "001", "Contact": "003", "Opportunity": "006", "Lead": "00Q"}
_CUSTOM_PREFIX = "a00"
_CHECKSUM_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"


def sf_error(status: int, code: str, message: str, fields: tuple[str, ...] = ()) -> Reply:
    """Salesforce's error answer: a JSON array of one `{message, errorCode, fields}`."""
    return Reply(status, [{"message": message, "errorCode": code, "fields": list(fields)}])


def not_found(message: str = "The requested resource does not exist") -> Reply:
    return sf_error(404, "NOT_FOUND", message)


def record_id(sobject: str, number: int) -> str:
    """An 18-character id: the type's key prefix, the number, and the case-safe suffix."""
    id15 = f"{_KEY_PREFIXES.get(sobject, _CUSTOM_PREFIX)}{number:012d}"
    return id15 + _suffix(id15)


def _suffix(id15: str) -> str:
    # Salesforce's 15-to-18 suffix: one character per five, encoding which are upper case.
    chunks = (id15[i : i + 5] for i in range(0, 15, 5))
    return "".join(
        _CHECKSUM_CHARS[sum(1 << bit for bit, c in enumerate(chunk) if c.isupper())]
        for chunk in chunks
    )


def _full_id(ref: str) -> str:
    """A 15-character id addresses the same record as its 18-character form."""
    return ref + _suffix(ref) if len(ref) == 15 else ref


class RecordStore:
    """The records API's behaviour over the shared state; every method returns a `Reply`.

    `base` is the request's `/services/data/vNN.N`, for the URLs answers carry.
    """

    def __init__(self, config: SandboxConfig, holder: StateHolder) -> None:
        self._config = config
        self._holder = holder

    def create(self, sobject: str, raw: bytes) -> Reply:
        """`POST …/sobjects/{Type}/`: insert a record."""
        try:
            type_config = self._type_config(sobject)
            fields = _parse_fields(raw)
            self._check_unique(sobject, type_config, fields, exclude_id=None)
        except Rejected as rejected:
            return rejected.reply
        record = self._insert(sobject, fields)
        self._record("create", sobject, record.id, raw, 201, self._lookups(sobject, fields))
        return Reply(201, {"id": record.id, "success": True, "errors": []})

    def read(self, sobject: str, ref: str, base: str) -> Reply:
        """`GET …/sobjects/{Type}/{id}`."""
        try:
            self._type_config(sobject)
            record = self._records(sobject).get(_full_id(ref))
        except Rejected as rejected:
            return rejected.reply
        return not_found() if record is None else Reply(200, render(sobject, record, base))

    def read_by(self, sobject: str, field: str, value: str, base: str) -> Reply:
        """`GET …/sobjects/{Type}/{Field}/{value}`: 404 absent, 300 when not unique."""
        try:
            [record] = self._matching(sobject, field, value, base)
        except Rejected as rejected:
            return rejected.reply
        return Reply(200, render(sobject, record, base))

    def update(self, sobject: str, ref: str, raw: bytes) -> Reply:
        """`PATCH …/sobjects/{Type}/{id}`: 204 with no body; every attempt is in the ledger."""
        try:
            type_config = self._type_config(sobject)
            fields = _parse_fields(raw)
            record = self._records(sobject).get(_full_id(ref))
            if record is None:
                raise Rejected(not_found())
            self._check_unique(sobject, type_config, fields, exclude_id=record.id)
        except Rejected as rejected:
            self._record("patch", sobject, _full_id(ref), raw, rejected.reply.status)
            return rejected.reply
        self._apply(sobject, record, fields, raw)
        return Reply(204)

    def upsert(self, sobject: str, field: str, value: str, raw: bytes, base: str) -> Reply:
        """`PATCH …/sobjects/{Type}/{Field}/{value}`: 201 created, 200 updated, 300 several."""
        try:
            matches = self._matching(sobject, field, value, base, absent_ok=True)
            type_config = self._type_config(sobject)
            fields = {**_parse_fields(raw), field: value}
            existing = matches[0] if matches else None
            exclude = existing.id if existing else None
            self._check_unique(sobject, type_config, fields, exclude_id=exclude)
        except Rejected as rejected:
            return rejected.reply
        if existing is not None:
            self._apply(sobject, existing, fields, raw)
            return Reply(200, {"id": existing.id, "success": True, "errors": [], "created": False})
        record = self._insert(sobject, fields)
        self._record("create", sobject, record.id, raw, 201, self._lookups(sobject, fields))
        return Reply(201, {"id": record.id, "success": True, "errors": [], "created": True})

    def delete(self, sobject: str, ref: str) -> Reply:
        """`DELETE …/sobjects/{Type}/{id}`: 204."""
        try:
            self._type_config(sobject)
            record = self._records(sobject).pop(_full_id(ref), None)
        except Rejected as rejected:
            return rejected.reply
        if record is None:
            return not_found()
        self._record("delete", sobject, record.id, b"", 204)
        return Reply(204)

    def list_records(self, sobject: str) -> list[JsonValue]:
        """Every stored record of a type, in creation order (the admin API's view)."""
        return [render(sobject, r, None) for r in self._records(sobject).values()]

    def _type_config(self, sobject: str) -> ObjectTypeConfig:
        type_config = self._config.object_types.get(sobject)
        if type_config is None:
            raise Rejected(not_found())
        return type_config

    def _records(self, sobject: str) -> dict[str, SalesforceRecord]:
        return self._holder.state.records.setdefault(sobject, {})

    def _matching(
        self, sobject: str, field: str, value: str, base: str, *, absent_ok: bool = False
    ) -> list[SalesforceRecord]:
        type_config = self._type_config(sobject)
        if field not in (*type_config.unique_properties, *type_config.external_ids):
            message = f"Provided external ID field does not exist or is not accessible: {field}"
            raise Rejected(not_found(message))
        found = [r for r in self._records(sobject).values() if _text(r.fields.get(field)) == value]
        if not found and not absent_ok:
            raise Rejected(not_found())
        if len(found) > 1:
            urls: list[JsonValue] = [_url(base, sobject, r.id) for r in found]
            raise Rejected(Reply(300, urls))
        return found

    def _check_unique(
        self, sobject: str, type_config: ObjectTypeConfig, fields: Fields, exclude_id: str | None
    ) -> None:
        others = [r for r in self._records(sobject).values() if r.id != exclude_id]
        for field in type_config.unique_properties:
            value = _text(fields.get(field))
            taken_by = next((r for r in others if _text(r.fields.get(field)) == value), None)
            if value is not None and taken_by is not None:
                message = f"duplicate value found: {field} duplicates value on record "
                message += f"with id: {taken_by.id}"
                raise Rejected(sf_error(400, "DUPLICATE_VALUE", message, (field,)))

    def _insert(self, sobject: str, fields: Fields) -> SalesforceRecord:
        state = self._holder.state
        number, state.next_id = state.next_id, state.next_id + 1
        at = now_iso()
        record = SalesforceRecord(
            id=record_id(sobject, number), fields=fields, created_at=at, updated_at=at
        )
        self._records(sobject)[record.id] = record
        return record

    def _apply(self, sobject: str, record: SalesforceRecord, fields: Fields, raw: bytes) -> None:
        record.fields.update(fields)
        record.updated_at = now_iso()
        self._record("patch", sobject, record.id, raw, 204, self._lookups(sobject, fields))

    def _lookups(self, sobject: str, fields: Fields) -> dict[str, str]:
        """The external-id values among `fields` (the ledger's `unique_values`)."""
        type_config = self._config.object_types[sobject]
        names = (*type_config.unique_properties, *type_config.external_ids)
        return {n: v for n in names if (v := _text(fields.get(n))) is not None}

    def _record(
        self,
        kind: LedgerKind,
        sobject: str,
        record_id: str | None,
        raw: bytes,
        status: int,
        lookups: dict[str, str] | None = None,
    ) -> None:
        append_entry(self._holder, kind, sobject, record_id, raw, status, lookups)


def render(sobject: str, record: SalesforceRecord, base: str | None) -> JsonValue:
    """A record as `GET` answers it: `attributes`, `Id`, its fields and system dates."""
    attributes: dict[str, JsonValue] = {"type": sobject}
    if base is not None:
        attributes["url"] = _url(base, sobject, record.id)
    system: dict[str, JsonValue] = {
        "CreatedDate": _sf_time(record.created_at),
        "LastModifiedDate": _sf_time(record.updated_at),
        "SystemModstamp": _sf_time(record.updated_at),
    }
    return {"attributes": attributes, "Id": record.id, **record.fields, **system}


def _url(base: str, sobject: str, record_id: str) -> str:
    return f"{base}/sobjects/{sobject}/{record_id}"


def _sf_time(iso: str) -> str:
    # Salesforce writes the offset without a colon: 2024-05-01T12:00:00.000+0000.
    return iso.removesuffix("Z") + "+0000"


def _parse_fields(raw: bytes) -> Fields:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise Rejected(sf_error(400, "JSON_PARSER_ERROR", f"Unexpected input: {exc}")) from exc
    if not isinstance(doc, dict):
        message = "Cannot deserialize instance of SObject from a value that is not an object"
        raise Rejected(sf_error(400, "JSON_PARSER_ERROR", message))
    doc.pop("attributes", None)  # a record read back may be sent as it came
    for name, value in doc.items():
        if isinstance(value, dict | list):
            message = f"Cannot deserialize the value of {name}: a field takes a scalar"
            raise Rejected(sf_error(400, "JSON_PARSER_ERROR", message, (name,)))
    return doc


def _text(value: JsonValue) -> str | None:
    """A field value as the text a URL carries (look-ups compare these)."""
    if value is None or isinstance(value, dict | list):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
