"""Streaming revalidation (issue 34, SPEC §9 REV-2): `revalidate plan` writes a JSON Lines
manifest a page at a time and `validate`/`apply` read it a page at a time; the page size
changes nothing a manifest decides or writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner

from cli.main import app
from db import revalidation as revalidation_q
from db.revalidation_owner import SELECT_FINALIZED_LINKS_PAGE
from protocol.link_row import LinkRowState
from protocol.revalidation import RevalidationResult
from protocol.revalidation_lines import ManifestWriter, header_for
from protocol.revalidation_manifest import ManifestRejected
from protocol.states import AttemptStatus
from services import revalidation as revalidation_activity
from services import revalidation_plan
from services.revalidation import apply, validate
from services.revalidation_source import ManifestFile
from tests.db.revalidation_support import APPROVAL, Links, S, attempt_at, hex64, plan, state
from tests.db.revalidation_support import links as links
from tests.db.rows import insert_link
from tests.db.scale_rows import fill

MEMBERS = 50


def _cli(*args: str) -> Awaitable[Any]:
    return asyncio.to_thread(CliRunner().invoke, app, ["revalidate", *args])


async def _fifty(conn: asyncpg.Connection, links: Links) -> None:
    for _ in range(MEMBERS - len(links.keys)):
        await insert_link(conn, links.old_pack)
    await conn.execute(
        "UPDATE connector_remote_link SET mapping_fingerprint = $1, body_fingerprint = $2",
        hex64("m1"),
        hex64("b1"),
    )


async def _write_plan(
    conn: asyncpg.Connection, links: Links, path: Path, keys: tuple[str, ...] | None = None
) -> Path:
    request = revalidation_plan.PlanRequest(
        operation_id="op-stream",
        approval=APPROVAL,
        new_pack_install_id=str(links.new_pack),
        link_keys=keys,
    )
    with path.open("wb") as out:
        await revalidation_plan.write_plan(conn, request, out)
    return path


def _receipts(result: RevalidationResult) -> list[dict[str, Any]]:
    return [r.model_dump() for r in result.receipts]


async def test_pages_of_seven_decide_and_write_what_one_page_does(
    conn: asyncpg.Connection, links: Links, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _fifty(conn, links)
    one_page = await _write_plan(conn, links, tmp_path / "one.jsonl")
    monkeypatch.setattr(revalidation_plan, "PLAN_PAGE", 7)
    paged = await _write_plan(conn, links, tmp_path / "paged.jsonl")
    assert paged.read_bytes() == one_page.read_bytes()  # the plan: the same file
    assert len(paged.read_bytes().splitlines()) == MEMBERS + 2

    whole = await validate(conn, ManifestFile.open(one_page))
    monkeypatch.setattr(revalidation_activity, "PAGE", 7)
    steps: list[str] = []
    projected = await validate(conn, ManifestFile.open(paged), lambda _, key: steps.append(key))
    assert whole.status is projected.status is S.VALIDATED
    assert _receipts(projected) == _receipts(whole) and projected.receipt_count == MEMBERS
    assert steps == sorted(steps) and len(steps) == MEMBERS

    applied = await apply(conn, ManifestFile.open(paged))
    assert applied.status is S.APPLIED and _receipts(applied) == _receipts(whole)
    written = await conn.fetch(
        "SELECT link_key FROM connector_link_revalidation_receipt WHERE operation_id = $1",
        "op-stream",
    )
    assert len(written) == MEMBERS
    after = await state(conn)
    again = await apply(conn, ManifestFile.open(paged))  # verify-only, page by page
    assert again.status is S.ALREADY_APPLIED and again.receipt_count == MEMBERS
    assert await state(conn) == after


async def test_a_conflict_on_a_late_page_rolls_back_the_pages_written_before_it(
    conn: asyncpg.Connection, links: Links, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _fifty(conn, links)
    path = await _write_plan(conn, links, tmp_path / "m.jsonl")
    last = json.loads(path.read_bytes().splitlines()[-2])["link_key"]
    await attempt_at(conn, links, last, AttemptStatus.PENDING)  # occupies the last link
    monkeypatch.setattr(revalidation_activity, "PAGE", 7)
    before = await state(conn)
    result = await apply(conn, ManifestFile.open(path))
    assert result.status is S.REJECTED
    assert [(c.link_key, c.reason.value) for c in result.conflicts] == [(last, "occupied")]
    assert await state(conn) == before  # the six pages before it: not written


async def test_plan_validate_apply_through_the_cli_with_json_lines(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path
) -> None:
    path = tmp_path / "move.jsonl"
    approval = ["--approved-by", "alice", "--approval-reference", "CHG-42", "--reason", "v2"]
    planned = await _cli(
        "plan", "--operation-id", "op-cli", *approval, "--all-finalized", "--out", str(path),
        "--new-pack-install", str(links.new_pack), "--json", "--database-url", db_dsn,
    )  # fmt: skip
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["members"] == len(links.keys)
    assert path.read_bytes().startswith(b'{"approval":')
    to_stdout = await _cli(
        "plan", "--operation-id", "op-cli", *approval, "--all-finalized",
        "--new-pack-install", str(links.new_pack), "--database-url", db_dsn,
    )  # fmt: skip
    assert to_stdout.exit_code == 0 and to_stdout.stdout_bytes == path.read_bytes()
    for command, code, status in [("validate", 0, "validated"), ("apply", 0, "applied"),
                                  ("apply", 4, "already_applied")]:  # fmt: skip
        result = await _cli(command, str(path), "--json", "--database-url", db_dsn)
        assert result.exit_code == code, result.output
        answer = json.loads(result.output)
        assert (answer["status"], answer["receipt_count"]) == (status, len(links.keys))
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:-1]))
    refused = await _cli("apply", str(cut), "--database-url", db_dsn)
    assert refused.exit_code == 2 and "cut short" in refused.output


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _plan_nodes(child))]


async def test_each_plan_page_reads_the_owner_finalized_key_index(db_dsn: str) -> None:
    """Migration 0130: a page of `plan --all-finalized` (and `revalidate owner`) walks
    the (owner, link key COLLATE "C") index of finalized links from the last key: no
    scan and sort of the link table per page (quadratic in the owner's links)."""
    conn = await asyncpg.connect(db_dsn)
    try:
        await fill(conn, 2000)  # (at a page of 5,000 the same holds from ~100,000 links)
        after = await conn.fetchval(
            'SELECT link_key FROM connector_remote_link ORDER BY link_key COLLATE "C" '
            "OFFSET 1000 LIMIT 1"
        )
        explained = await conn.fetchval(
            f"EXPLAIN (FORMAT JSON) {SELECT_FINALIZED_LINKS_PAGE}", "owner-1", after, 50
        )
    finally:
        await conn.close()
    nodes = _plan_nodes(json.loads(explained)[0]["Plan"])
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], nodes
    assert {n.get("Index Name") for n in nodes} >= {"connector_remote_link_finalized_key_ix"}


async def test_a_file_changed_after_its_check_is_refused_and_nothing_is_written(
    conn: asyncpg.Connection, links: Links, tmp_path: Path
) -> None:
    path = await _write_plan(conn, links, tmp_path / "m.jsonl")
    manifest = ManifestFile.open(path)
    # A valid manifest of its own (same operation, one member), where the checked one was.
    other = await _write_plan(conn, links, tmp_path / "other.jsonl", (links.keys[0],))
    path.write_bytes(other.read_bytes())
    before = await state(conn)
    with pytest.raises(ManifestRejected, match="changed after it was checked"):
        await apply(conn, manifest)
    assert not conn.is_in_transaction()
    assert await state(conn) == before


async def test_links_of_another_owner_than_the_header_names_are_rejected(
    conn: asyncpg.Connection, links: Links, tmp_path: Path
) -> None:
    """The header's owner key is the lock scope: a member whose link belongs to another
    owner would not be covered by it, so it is a conflict (nothing written)."""
    planned = await plan(conn, links, links.keys)
    writer = ManifestWriter(header_for("op-other", "someone-else", APPROVAL))
    lines = [writer.start(), *(writer.member(m) for m in planned.members)]
    path = tmp_path / "other-owner.jsonl"
    path.write_bytes(b"".join([*lines, writer.finish()[0]]))
    before = await state(conn)
    for entry in (validate, apply):
        result = await entry(conn, ManifestFile.open(path))
        assert [(c.link_key, c.reason.value) for c in result.conflicts] == [
            (key, "other_owner") for key in links.keys
        ]
    assert await state(conn) == before


async def test_locked_rows_are_made_as_validation_would_make_them(
    conn: asyncpg.Connection, links: Links
) -> None:
    """The page read's models are made without validating them again (protocol.trusted):
    the columns it selects are the model's, typed as its fields, so each equals the model
    `model_validate` makes of the same row, the snapshot parsed once and shared."""
    snapshot = {"profile_name": "main", "retry": [1, 2.5], "note": "é"}
    await conn.execute(
        "UPDATE connector_remote_link SET profile_snapshot = $1::jsonb", json.dumps(snapshot)
    )
    rows = await revalidation_q.rows_for_update(conn, list(links.keys))
    made = [locked.state for locked in revalidation_q.locked_rows(rows)]
    assert [model.link_key for model in made] == sorted(links.keys)
    for row, model in zip(rows, made, strict=True):
        values = {key: value for key, value in dict(row).items() if key != "row_version"}
        values["profile_snapshot"] = json.loads(values["profile_snapshot"])
        validated = LinkRowState.model_validate(values)
        assert (model, vars(model), model.model_fields_set) == (
            validated,
            vars(validated),
            validated.model_fields_set,
        )
    assert made[0].profile_snapshot == snapshot
    assert made[0].profile_snapshot is made[1].profile_snapshot
