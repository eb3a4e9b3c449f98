"""The JSON Lines revalidation manifest (REV-2, NF-7): one member a line.

A manifest of a million members is impractical as one JSON document (it must be held
whole to be parsed and digested), so `revalidate plan` writes, and `validate`/`apply`
read, this form a line at a time:

    line 1      the header: format, operation_id, connector_owner_key, approval, algorithms
    lines 2..   one member each, strictly sorted by link_key (so no duplicates)
    last line   the trailer: {"manifest_digest": <sha256 hex>, "members": <count>}

Every line is its value's canonical JSON (sorted keys, no whitespace), and
`manifest_digest` is the sha256 of every line before the trailer, each with its "\\n".
Invariant 1 of the seed is checked here line by line, in bounded memory: `ManifestLines`
is fed the lines in order and raises `ManifestRejected` at the first problem; the caller
reads the file (this module does no I/O). `ManifestWriter` produces the same lines.
A manifest's links must all belong to its header's owner key: that is the one lock scope
validate and apply take (db/links.py owner_scope_lock_key).
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from typing import Final, Literal, TypeVar

from pydantic import Field, ValidationError

from protocol.canonical import canonical_json
from protocol.revalidation_manifest import (
    _SHAPES,
    BODY_FINGERPRINT_ALGORITHM,
    MAPPING_FINGERPRINT_ALGORITHM,
    MOVED_NEW,
    MOVED_OLD,
    Approval,
    Hex64,
    ManifestHead,
    ManifestRejected,
    ManifestRejectReason,
    OperationId,
    RevalidationMember,
    Text,
    _shape_error,
    _Strict,
)

LINES_FORMAT: Final = "connector-push/mapping-revalidation/v2+jsonl"
R = ManifestRejectReason


class ManifestHeader(_Strict):
    format: Literal["connector-push/mapping-revalidation/v2+jsonl"]
    operation_id: OperationId
    connector_owner_key: Text = Field(min_length=1)
    approval: Approval
    mapping_fingerprint_algorithm: Text
    body_fingerprint_algorithm: Text


class ManifestTrailer(_Strict):
    manifest_digest: Hex64
    members: int = Field(ge=0)


def header_for(operation_id: str, owner_key: str, approval: Approval) -> ManifestHeader:
    return ManifestHeader(
        format=LINES_FORMAT,
        operation_id=operation_id,
        connector_owner_key=owner_key,
        approval=approval,
        mapping_fingerprint_algorithm=MAPPING_FINGERPRINT_ALGORITHM,
        body_fingerprint_algorithm=BODY_FINGERPRINT_ALGORITHM,
    )


def is_lines_header(first_line: bytes) -> bool:
    """Whether a file's first line starts a JSON Lines manifest (else: a JSON document)."""
    return first_line.lstrip().startswith(b"{") and LINES_FORMAT.encode() in first_line


def _where(error: ManifestRejected, line_number: int) -> ManifestRejected:
    return ManifestRejected(error.reason, f"line {line_number}: {error.detail}")


M = TypeVar("M", bound=_Strict)


# A member's fields in the order canonical JSON writes them.
_MEMBER_FIELDS: Final = tuple(sorted(RevalidationMember.model_fields))


def member_line(member: RevalidationMember) -> bytes:
    """`canonical_json` of the member, written directly (a member line is written and
    checked a million times): every field is null or a string of a checked shape (hex
    digits, a uuid, a link key, an operation id), none of which JSON escapes."""
    values = vars(member)
    members = [
        f'"{key}":null' if (value := values[key]) is None else f'"{key}":"{value}"'
        for key in _MEMBER_FIELDS
    ]
    return ("{" + ",".join(members) + "}").encode()


@cache
def _canonical_member() -> re.Pattern[bytes]:
    """The one spelling `member_line` gives a valid member, as a pattern over its bytes:
    each field in order, its value null (where the model allows it) or its own shape in
    quotes, with a named group per value. Built from the model's own field shapes, each
    one of `_SHAPES`, none of which admits a character JSON escapes, so a line matches
    exactly when the model parses it and `member_line` writes it back unchanged (a test
    compares the two on edited lines)."""
    schema = RevalidationMember.model_json_schema()
    fields = []
    for name in _MEMBER_FIELDS:
        field = schema["properties"][name]
        values = []
        for choice in field.get("anyOf", [field]):
            shape = choice.get("pattern")
            if choice == {"type": "null"}:
                values.append("null")
            elif choice.get("type") == "string" and shape in _SHAPES:
                values.append(f'"(?P<{name}>{shape.removeprefix("^").removesuffix("$")})"')
            else:
                raise TypeError(f"member field {name}: no canonical pattern for {choice}")
        fields.append(re.escape(f'"{name}":') + f"(?:{'|'.join(values)})")
    return re.compile((r"\{" + ",".join(fields) + r"\}").encode())


def _canonical(value: _Strict) -> bytes:
    if isinstance(value, RevalidationMember):
        return member_line(value)
    return canonical_json(value.model_dump(mode="json"))


def _parse(model: type[M], line: bytes, line_number: int) -> M:
    try:
        value = model.model_validate_json(line)
    except ValidationError as error:
        raise _where(_shape_error(error), line_number) from None
    if _canonical(value) != line:
        raise ManifestRejected(
            R.NON_CANONICAL_STRING,
            f"line {line_number}: not canonical JSON (sorted keys, no whitespace)",
        )
    return value


class _Lines:
    """The digest and sort order both the reader and the writer keep."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._last_key: str | None = None
        self.count = 0

    def _add_header(self, line: bytes) -> None:
        self._digest.update(line + b"\n")

    def _add_member(self, member: RevalidationMember, line: bytes) -> None:
        self._add(member.link_key, member.changes_nothing, line)

    def _add(self, link_key: str, changes_nothing: bool, line: bytes) -> None:
        if self._last_key is not None and link_key <= self._last_key:
            same = link_key == self._last_key
            reason = R.DUPLICATE_LINK_KEY if same else R.UNSORTED_MEMBERS
            raise ManifestRejected(
                reason, f"{self._where(link_key)}: members must be strictly sorted by link_key"
            )
        if changes_nothing:
            raise ManifestRejected(
                R.NOOP_MEMBER, f"{self._where(link_key)}: old and new are identical"
            )
        self._last_key = link_key
        self._digest.update(line + b"\n")
        self.count += 1

    def _where(self, link_key: str) -> str:
        return f"line {self.count + 2}: {link_key}"

    def _hexdigest(self) -> str:
        return self._digest.hexdigest()


def _head(header: ManifestHeader, manifest_digest: str, count: int) -> ManifestHead:
    return ManifestHead(
        operation_id=header.operation_id,
        approval=header.approval,
        mapping_fingerprint_algorithm=header.mapping_fingerprint_algorithm,
        body_fingerprint_algorithm=header.body_fingerprint_algorithm,
        manifest_digest=manifest_digest,
        member_count=count,
        connector_owner_key=header.connector_owner_key,
    )


class ManifestLines(_Lines):
    """Invariant 1 over a JSON Lines manifest: feed the header line (constructor), then
    each member line (`member`, or `check` for a pass that needs no models), then the
    trailer (`finish`), each without its newline.

    `reread=True` is for a second pass over a file already checked whole: members are
    parsed and hashed but not re-serialised to prove them canonical, since `finish`
    proves the bytes are those checked (the same digest) before anything commits."""

    def __init__(self, header_line: bytes, *, reread: bool = False) -> None:
        super().__init__()
        self._reread = reread
        self.header = _parse(ManifestHeader, header_line, 1)
        algorithms = (
            self.header.mapping_fingerprint_algorithm,
            self.header.body_fingerprint_algorithm,
        )
        if algorithms != (MAPPING_FINGERPRINT_ALGORITHM, BODY_FINGERPRINT_ALGORITHM):
            expected = f"{MAPPING_FINGERPRINT_ALGORITHM} / {BODY_FINGERPRINT_ALGORITHM}"
            raise ManifestRejected(
                R.UNSUPPORTED_ALGORITHM, f"{algorithms[0]} / {algorithms[1]}; expected {expected}"
            )
        self._add_header(header_line)

    def member(self, line: bytes) -> RevalidationMember:
        if self._reread:
            try:
                member = RevalidationMember.model_validate_json(line)
            except ValidationError as error:
                raise _where(_shape_error(error), self.count + 2) from None
        else:
            member = _parse(RevalidationMember, line, self.count + 2)
        self._add_member(member, line)
        return member

    def check(self, line: bytes) -> None:
        """`member` without the model, for the pass that only checks (`validate` and `apply`
        check the whole file before their transaction, then read it again): a line in the
        canonical spelling (`_canonical_member`) is ordered and digested from its own
        bytes; any other line is parsed as `member` parses it, to say why it is refused."""
        match = _canonical_member().fullmatch(line)
        if match is None:
            _parse(RevalidationMember, line, self.count + 2)  # raises, naming the problem
            raise ManifestRejected(  # unreachable while the pattern is exact; refused anyway
                R.NON_CANONICAL_STRING, f"line {self.count + 2}: not canonical JSON"
            )
        unchanged = match.group(*MOVED_OLD) == match.group(*MOVED_NEW)  # groups by field
        self._add(match["link_key"].decode(), unchanged, line)

    def finish(self, trailer_line: bytes | None) -> ManifestHead:
        """The checked head; None: the file ended without a trailer (cut short)."""
        if trailer_line is None:
            raise ManifestRejected(R.INVALID_SHAPE, "no trailer line: the manifest is cut short")
        trailer = _parse(ManifestTrailer, trailer_line, self.count + 2)
        if self.count == 0:
            raise ManifestRejected(R.NO_MEMBERS, "a manifest names at least one link")
        if trailer.members != self.count:
            raise ManifestRejected(
                R.INVALID_SHAPE,
                f"the trailer says {trailer.members} members, the file has {self.count}",
            )
        recomputed = self._hexdigest()
        if recomputed != trailer.manifest_digest:
            raise ManifestRejected(
                R.DIGEST_MISMATCH,
                f"manifest_digest {trailer.manifest_digest}, recomputed {recomputed}",
            )
        return _head(self.header, recomputed, self.count)


class ManifestWriter(_Lines):
    """The lines of a manifest, in order: `start`, `member` for each (sorted), `finish`."""

    def __init__(self, header: ManifestHeader) -> None:
        super().__init__()
        self.header = header

    def start(self) -> bytes:
        line = canonical_json(self.header.model_dump(mode="json"))
        self._add_header(line)
        return line + b"\n"

    def member(self, member: RevalidationMember) -> bytes:
        line = member_line(member)
        self._add_member(member, line)
        return line + b"\n"

    def finish(self) -> tuple[bytes, ManifestHead]:
        if self.count == 0:
            raise ManifestRejected(R.NO_MEMBERS, "a manifest names at least one link")
        trailer = ManifestTrailer(manifest_digest=self._hexdigest(), members=self.count)
        head = _head(self.header, trailer.manifest_digest, self.count)
        return canonical_json(trailer.model_dump(mode="json")) + b"\n", head
