"""The JSON Lines revalidation manifest (issue 34, SPEC §9 REV-2 invariant 1), pure: the
lines `ManifestWriter` writes are what `ManifestLines` accepts, and every way a file can
stop being its canonical, approved self is refused line by line."""

from __future__ import annotations

import hashlib
import json

import pytest

from protocol.canonical import canonical_json
from protocol.link_row import plan_member
from protocol.revalidation_lines import (
    ManifestLines,
    ManifestWriter,
    header_for,
    is_lines_header,
    member_line,
)
from protocol.revalidation_manifest import (
    Approval,
    ManifestHead,
    ManifestRejected,
    ManifestRejectReason,
    RevalidationMember,
)
from tests.unit.test_revalidation_manifest import APPROVAL, NEW_PACK, hex64, row

R = ManifestRejectReason


def members(*numbers: int) -> list[RevalidationMember]:
    return [plan_member(row(n), hex64("m2"), hex64("b2"), NEW_PACK) for n in numbers]


def written(numbers: tuple[int, ...] = (1, 2, 3), approval: Approval = APPROVAL) -> list[bytes]:
    writer = ManifestWriter(header_for("op-1", "owner", approval))
    lines = [writer.start(), *(writer.member(m) for m in members(*numbers))]
    trailer, _ = writer.finish()
    return [line.removesuffix(b"\n") for line in [*lines, trailer]]


def read(lines: list[bytes]) -> tuple[list[RevalidationMember], ManifestHead]:
    reader = ManifestLines(lines[0])
    got = [reader.member(line) for line in lines[1:-1]]
    return got, reader.finish(lines[-1])


def refused(lines: list[bytes]) -> ManifestRejectReason:
    with pytest.raises(ManifestRejected) as caught:
        read(lines)
    return caught.value.reason


def resigned(lines: list[bytes]) -> list[bytes]:
    """The trailer recomputed over the (edited) lines: only the edit can be refused."""
    digest = hashlib.sha256(b"".join(line + b"\n" for line in lines[:-1])).hexdigest()
    trailer = {"manifest_digest": digest, "members": len(lines) - 2}
    return [*lines[:-1], json.dumps(trailer, sort_keys=True, separators=(",", ":")).encode()]


def test_written_lines_read_back_as_the_same_members_and_head() -> None:
    lines = written()
    assert is_lines_header(lines[0]) and not is_lines_header(b'{"format":"other"}')
    got, head = read(lines)
    assert got == members(1, 2, 3)
    assert (head.member_count, head.connector_owner_key, head.operation_id) == (3, "owner", "op-1")
    assert head.manifest_digest == json.loads(lines[-1])["manifest_digest"]


def test_the_digest_covers_every_line_before_the_trailer() -> None:
    lines = written()
    edited = json.loads(lines[2])
    edited["new_body_fingerprint"] = hex64("forged")
    forged = [*lines[:2], json.dumps(edited, sort_keys=True, separators=(",", ":")).encode()]
    assert refused([*forged, *lines[3:]]) is R.DIGEST_MISMATCH
    assert read(resigned([*forged, *lines[3:]]))[1].member_count == 3  # re-signed: readable
    header = json.loads(lines[0])
    header["connector_owner_key"] = "someone-else"
    other = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    assert refused([other, *lines[1:]]) is R.DIGEST_MISMATCH


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("unsorted", R.UNSORTED_MEMBERS),
        ("duplicate", R.DUPLICATE_LINK_KEY),
        ("spaces", R.NON_CANONICAL_STRING),
        ("no-trailer", R.INVALID_SHAPE),
        ("count", R.INVALID_SHAPE),
        ("no-members", R.NO_MEMBERS),
        ("extra-field", R.INVALID_SHAPE),
    ],
)
def test_each_broken_file_is_refused_naming_why(edit: str, reason: ManifestRejectReason) -> None:
    lines = written()
    match edit:
        case "unsorted":
            lines = resigned([lines[0], lines[2], lines[1], *lines[3:]])
        case "duplicate":
            lines = resigned([lines[0], lines[1], lines[1], *lines[3:]])
        case "spaces":
            member = json.dumps(json.loads(lines[1]), sort_keys=True).encode()  # ", " and ": "
            lines = resigned([lines[0], member, *lines[2:]])
        case "no-trailer":
            reader = ManifestLines(lines[0])
            for line in lines[1:-1]:
                reader.member(line)
            with pytest.raises(ManifestRejected) as caught:
                reader.finish(None)
            assert caught.value.reason is reason
            return
        case "count":
            trailer = json.loads(lines[-1])
            trailer["members"] = 4
            lines = [*lines[:-1], json.dumps(trailer, separators=(",", ":")).encode()]
        case "no-members":
            lines = resigned([lines[0], lines[-1]])
        case "extra-field":
            member = json.loads(lines[1])
            member["zz"] = 1
            extra = json.dumps(member, sort_keys=True, separators=(",", ":")).encode()
            lines = resigned([lines[0], extra, *lines[2:]])
    assert refused(lines) is reason


def test_the_header_is_checked_before_any_member() -> None:
    lines = written()
    header = json.loads(lines[0])
    header["approval"]["reason"] = ""
    empty = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    assert refused(resigned([empty, *lines[1:]])) is R.EMPTY_APPROVAL
    header = json.loads(lines[0])
    header["body_fingerprint_algorithm"] = "md5"
    with pytest.raises(ManifestRejected) as unsupported:
        ManifestLines(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    assert unsupported.value.reason is R.UNSUPPORTED_ALGORITHM


def test_the_writer_refuses_what_the_reader_would() -> None:
    writer = ManifestWriter(header_for("op-1", "owner", APPROVAL))
    writer.start()
    writer.member(members(2)[0])
    with pytest.raises(ManifestRejected) as caught:
        writer.member(members(1)[0])
    assert caught.value.reason is R.UNSORTED_MEMBERS
    empty = ManifestWriter(header_for("op-1", "owner", APPROVAL))
    empty.start()
    with pytest.raises(ManifestRejected) as none:
        empty.finish()
    assert none.value.reason is R.NO_MEMBERS


@pytest.mark.parametrize("pointer", [None, "op-0.1:a_b"])
def test_a_member_line_is_the_members_canonical_json(pointer: str | None) -> None:
    [member] = members(7)
    member = member.model_copy(update={"expected_revalidation_operation_id": pointer})
    assert member_line(member) == canonical_json(member.model_dump(mode="json"))
