"""Load local records and read grants from a document (`connector-push records load`).

The document is validated completely before anything is written, and loaded in
one transaction. Each record may name its owner (the connector owner key, S-1), or
take the document's `owner`. Loading is idempotent: records merge their fields (a record
whose fields already match keeps its version), and each grant entry states the
*complete* access of one user on one object, replacing what was there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, ValidationError

from db import records as q
from protocol.identity import check_part
from protocol.storable import MEANINGS, location_text, unstorable_at

ALL_RECORDS = "*"


def _id(value: str) -> str:
    return check_part("id", value)


Id = Annotated[str, AfterValidator(_id)]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecordSpec(_Doc):
    object: Id
    id: Id
    fields: dict[str, JsonValue]
    deleted: bool = False
    # The connector owner key the record belongs to (S-1: a save API client saves only
    # its owners' records); unset, the document's `owner`, else what the store holds.
    owner: Id | None = None


class GrantSpec(_Doc):
    """`user` reads `object` (unless `object_read` is false), the listed records
    (or `"*"`: every record of the object in the store at load time) and fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    user: Id
    object: Id
    object_read: bool = Field(default=True, alias="objectRead")
    records: Literal["*"] | tuple[Id, ...] = ()
    fields: tuple[Id, ...] = ()


class RecordsDocument(_Doc):
    # The owner of every record that names none (S-1).
    owner: Id | None = None
    records: tuple[RecordSpec, ...] = ()
    grants: tuple[GrantSpec, ...] = ()


class RecordsFileInvalid(ValueError):
    """A records document rejected before anything is written; `problems` name fields."""

    def __init__(self, problems: tuple[str, ...]) -> None:
        super().__init__("invalid records file:\n  " + "\n  ".join(problems))
        self.problems = problems


def _loc(loc: tuple[int | str, ...]) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    return text.lstrip(".") or "document"


def _duplicates(doc: RecordsDocument) -> tuple[str, ...]:
    records = Counter((r.object, r.id) for r in doc.records)
    grants = Counter((g.user, g.object) for g in doc.grants)
    problems = [
        f"records[{i}]: duplicate record {r.object}/{r.id}"
        for i, r in enumerate(doc.records)
        if records[(r.object, r.id)] > 1
    ]
    problems += [
        f"grants[{i}]: more than one grant for user {g.user!r} on {g.object!r}"
        for i, g in enumerate(doc.grants)
        if grants[(g.user, g.object)] > 1
    ]
    return tuple(problems)


def parse_records_document(data: object) -> RecordsDocument:
    """Validate a parsed YAML/JSON document; raises `RecordsFileInvalid`."""
    if not isinstance(data, Mapping):
        raise RecordsFileInvalid(("document: must be a mapping with `records` and `grants`",))
    if (found := unstorable_at(dict(data))) is not None:  # NaN, "\0": the database refuses
        where, reason = found
        raise RecordsFileInvalid((f"{location_text(where)}: {MEANINGS[reason]}",))
    try:
        doc = RecordsDocument.model_validate(data)
    except ValidationError as error:
        raise RecordsFileInvalid(
            tuple(
                f"{_loc(e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                for e in error.errors()
            )
        ) from error
    if problems := _duplicates(doc):
        raise RecordsFileInvalid(problems)
    return doc


@dataclass(frozen=True)
class LoadSummary:
    records_written: int
    records_unchanged: int
    grants: int


async def _apply_grant(conn: q.Conn, grant: GrantSpec) -> None:
    await q.upsert_object_permission(conn, grant.user, grant.object, grant.object_read)
    await q.delete_record_permissions(conn, grant.user, grant.object)
    if grant.records == ALL_RECORDS:
        await q.insert_all_record_permissions(conn, grant.user, grant.object)
    else:
        await q.insert_record_permissions(conn, grant.user, grant.object, grant.records)
    await q.delete_field_permissions(conn, grant.user, grant.object)
    await q.insert_field_permissions(conn, grant.user, grant.object, grant.fields)


async def load_records(conn: q.Conn, doc: RecordsDocument) -> LoadSummary:
    """Write the document's records, then its grants, in one transaction."""
    written = 0
    async with conn.transaction():
        for record in doc.records:
            version = await q.upsert_record(
                conn,
                record.object,
                record.id,
                record.fields,
                deleted=record.deleted,
                owner_key=record.owner or doc.owner,
            )
            written += version is not None
        for grant in doc.grants:
            await _apply_grant(conn, grant)
    return LoadSummary(written, len(doc.records) - written, len(doc.grants))
