"""The JSON Lines revalidation manifest (issue 34, SPEC §9 REV-2 invariant 1), pure: the
lines `ManifestWriter` writes are what `ManifestLines` accepts, and every way a file can
stop being its canonical, approved self is refused line by line."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from tests.examples import examples
from tests.unit.test_revalidation_manifest import APPROVAL, NEW_PACK, hex64, row

R = ManifestRejectReason


def members(*numbers: int) -> list[RevalidationMember]:
    return [plan_member(row(n), hex64("m2"), hex64("b2"), NEW_PACK) for n in numbers]


def written(numbers: tuple[int, ...] = (1, 2, 3), approval: Approval = APPROVAL) -> list[bytes]:
    writer = ManifestWriter(header_for("op-1", "owner", approval))
    lines = [writer.start(), *(writer.member(m) for m in members(*numbers))]
    trailer, _ = writer.finish()
    return [line.removesuffix(b"\n") for line in [*lines, trailer]]


def read(
    lines: list[bytes], *, check_only: bool = False
) -> tuple[list[RevalidationMember], ManifestHead]:
    """The members and head, or (`check_only`, the pass before the transaction) the head
    alone, each line matched against the canonical spelling instead of parsed."""
    reader = ManifestLines(lines[0])
    if check_only:
        for line in lines[1:-1]:
            reader.check(line)
        return [], reader.finish(lines[-1])
    got = [reader.member(line) for line in lines[1:-1]]
    head = reader.finish(lines[-1])
    # The second reading (of a file checked whole) reads the same members and head.
    again = ManifestLines(lines[0], reread=True)
    assert [again.member(line) for line in lines[1:-1]] == got
    assert again.finish(lines[-1]) == head
    return got, head


def refused(lines: list[bytes]) -> ManifestRejectReason:
    """Why both passes refuse `lines` (the same reason for both, or the test fails)."""
    reasons = []
    for check_only in (False, True):
        with pytest.raises(ManifestRejected) as caught:
            read(lines, check_only=check_only)
        reasons.append(caught.value.reason)
    assert reasons[0] is reasons[1], reasons
    return reasons[0]


def verdict(header: bytes, line: bytes, *, check_only: bool) -> str:
    """What one pass says of a manifest's first member line: "ok" or the reason."""
    reader = ManifestLines(header)
    try:
        reader.check(line) if check_only else reader.member(line)
    except ManifestRejected as rejected:
        return rejected.reason.value
    return "ok"


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
    assert read(lines, check_only=True)[1] == head
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


def _escaped(line: bytes, at: int) -> bytes:
    """The line with the string character at `at` written as a JSON \\u escape."""
    return line[:at] + f"\\u{line[at]:04x}".encode() + line[at + 1 :]


def _edits() -> list[tuple[str, bytes]]:
    line = written((1,))[1]
    member = json.loads(line)
    pointer = dict(member, expected_revalidation_operation_id="op-0.1:a_b")
    digest_at = line.index(b'"expected_row_digest":"') + len(b'"expected_row_digest":"')
    return [
        ("as written", line),
        ("a pointer", canonical_json(pointer)),
        ("spaces", json.dumps(member, sort_keys=True).encode()),
        (
            "keys unsorted",
            json.dumps(dict(reversed(member.items())), separators=(",", ":")).encode(),
        ),
        ("an escaped digit", _escaped(line, digest_at)),
        ("upper-case hex", line[:digest_at] + line[digest_at:].replace(b"a", b"A", 1)),
        ("null where required", canonical_json(dict(member, expected_row_digest=None))),
        ("a number", canonical_json(dict(member, expected_row_digest=7))),
        ("a field missing", canonical_json({k: v for k, v in member.items() if k != "link_key"})),
        ("an extra field", canonical_json(dict(member, zz="x"))),
        (
            "nothing moves",
            canonical_json(
                dict(
                    member,
                    new_pack_install_id=member["old_pack_install_id"],
                    new_mapping_fingerprint=member["old_mapping_fingerprint"],
                    new_body_fingerprint=member["old_body_fingerprint"],
                )
            ),
        ),
        ("a trailing newline", line + b"\r"),
        ("not JSON", line[:-1]),
    ]


@pytest.mark.parametrize(("edit", "line"), _edits(), ids=[edit for edit, _ in _edits()])
def test_the_check_only_pass_says_what_parsing_says_of_each_edit(edit: str, line: bytes) -> None:
    header = written((1,))[0]
    assert verdict(header, line, check_only=True) == verdict(header, line, check_only=False)


# Bytes an edit may put anywhere in a line: JSON's own syntax, the shapes' characters and
# their near misses (upper case, other punctuation), a control byte, a UTF-8 sequence.
EDIT_BYTES = sorted(set(b' "\\,:{}[]0123456789abcdefgABCDEF-_.:lknrtu\x00') | {0xC3, 0xA9})


@settings(max_examples=examples(600))
@given(st.data())
def test_the_check_only_pass_agrees_with_parsing_on_any_edited_member_line(
    data: st.DataObject,
) -> None:
    header, line = written((1,))[:2]
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        at = data.draw(st.integers(0, len(line)), label="at")
        kind = data.draw(st.sampled_from(["insert", "delete", "replace"]), label="kind")
        byte = bytes([data.draw(st.sampled_from(EDIT_BYTES), label="byte")])
        if kind == "insert":
            line = line[:at] + byte + line[at:]
        else:
            line = line[:at] + (byte if kind == "replace" else b"") + line[at + 1 :]
    assert verdict(header, line, check_only=True) == verdict(header, line, check_only=False)
