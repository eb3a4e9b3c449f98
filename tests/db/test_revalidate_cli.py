"""`revalidate` CLI against real Postgres: invariant 1 before any connection, and the exit
codes that tell applied, already applied and rejected apart."""

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
from db import revalidation as q
from protocol.link_row import (
    plan_member,
)
from protocol.revalidation_manifest import (
    build_manifest,
    document_digest,
)
from protocol.states import AttemptStatus
from services.revalidation import apply, validate
from tests.db.revalidation_support import (
    APPROVAL,
    C,
    Links,
    attempt_at,
    hex64,
    plan,
    produced,
    reasons,
    state,
)
from tests.db.revalidation_support import links as links
from tests.db.rows import (
    insert_link,
)


def _cli(*args: str) -> Awaitable[Any]:
    return asyncio.to_thread(CliRunner().invoke, app, ["revalidate", *args])


def _redigest_forgery(document: dict[str, Any], edit: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(document))
    if edit == "digest-mismatch":
        doc["members"][0]["new_body_fingerprint"] = hex64("forged")
        return doc
    if edit == "duplicate":
        doc["members"] = [doc["members"][0], doc["members"][0]]
    else:
        doc["approval"]["reason"] = ""
    doc["manifest_digest"] = document_digest(doc)
    return doc


@pytest.mark.parametrize("edit", ["digest-mismatch", "duplicate", "empty-approval"])
async def test_bad_manifests_exit_2_before_touching_the_database(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path, edit: str
) -> None:
    manifest = await plan(conn, links, links.keys)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(_redigest_forgery(manifest.document(), edit)))
    before = await state(conn)
    for command in ("validate", "apply"):
        result = await _cli(command, str(path), "--database-url", db_dsn)
        assert result.exit_code == 2, result.output
        # An unreachable database would exit 1: the check never opens a connection.
        unreachable = "postgresql://nobody@127.0.0.1:1/none"
        assert (await _cli(command, str(path), "--database-url", unreachable)).exit_code == 2
    assert await state(conn) == before


@pytest.mark.parametrize("field", ["new_mapping_fingerprint", "new_body_fingerprint"])
async def test_an_edited_member_with_a_recomputed_digest_is_rejected_exit_3(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path, field: str
) -> None:
    """Item 6 / REV-2: the digest proves the file consistent, not the values; each member's
    new fingerprints are recomputed from its new install, so a forgery writes nothing."""
    doc: dict[str, Any] = (await plan(conn, links, links.keys)).document()
    doc["members"][1][field] = "0" * 64
    doc["manifest_digest"] = document_digest(doc)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    before = await state(conn)
    for command in ("validate", "apply"):
        result = await _cli(command, str(path), "--json", "--database-url", db_dsn)
        assert result.exit_code == 3, result.output
        answer = json.loads(result.output)
        assert answer["status"] == "rejected" and answer["receipts"] == []
        assert [(c["link_key"], c["reason"]) for c in answer["conflicts"]] == [
            (links.keys[1], "not_the_installs_fingerprints")
        ]
    assert await state(conn) == before


async def test_a_member_moving_to_an_install_without_its_slot_is_rejected(
    conn: asyncpg.Connection, links: Links
) -> None:
    rows = await q.link_states(conn, links.keys[:1])
    empty = str(links.old_pack)  # its manifest is not a pack: it produces nothing
    members = [plan_member(rows[0], *produced(links, "2", rows[0]), empty)]
    manifest = build_manifest("op-x", APPROVAL, members)
    for entry in (validate, apply):
        assert reasons(await entry(conn, manifest)) == [
            (links.keys[0], C.NOT_THE_INSTALLS_FINGERPRINTS)
        ]


async def test_cli_exit_codes_distinguish_applied_already_applied_and_rejected(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path
) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps((await plan(conn, links, links.keys[:2])).document()))
    bad.write_text(json.dumps((await plan(conn, links, links.keys[2:], op="op-9")).document()))
    await attempt_at(conn, links, links.keys[2], AttemptStatus.PENDING)
    expected = [
        ("validate", good, 0, "validated"),
        ("apply", good, 0, "applied"),
        ("apply", good, 4, "already_applied"),
        ("validate", good, 4, "already_applied"),
        ("apply", bad, 3, "rejected"),
    ]
    for command, path, code, status in expected:
        result = await _cli(command, str(path), "--json", "--database-url", db_dsn)
        assert (result.exit_code, json.loads(result.output)["status"]) == (code, status)
    human = await _cli("apply", str(good), "--database-url", db_dsn)
    assert human.exit_code == 4 and "already applied" in human.output


async def test_a_large_manifest_applies_through_the_cli_with_a_human_table(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path
) -> None:
    keys = links.keys + [await insert_link(conn, links.old_pack) for _ in range(60)]
    await conn.execute(
        "UPDATE connector_remote_link SET mapping_fingerprint = $1, body_fingerprint = $2",
        hex64("m1"),
        hex64("b1"),
    )
    path = tmp_path / "large.json"
    path.write_text(json.dumps((await plan(conn, links, keys)).document()))
    result = await _cli("apply", str(path), "--database-url", db_dsn)
    assert result.exit_code == 0, result.output
    assert "applied" in result.output and "63 link(s)" in result.output
    assert len((await state(conn))[1]) == 63
