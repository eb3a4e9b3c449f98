"""`links show` / `links find` queries (SPEC OPS-1): every key with rows, the newest 20
PATCHes unless --all, and the park reason of a key that has no link yet."""

from __future__ import annotations

import asyncpg

from cli.link_views import PATCHES_SHOWN, find, key_view
from db import link_search
from protocol.park import ParkReason
from tests.db.rows import (
    insert_attempt,
    insert_link,
    insert_pack_install,
    insert_patch,
    new_link_key,
    set_status,
)


async def test_show_lists_the_newest_patches_unless_all(conn: asyncpg.Connection) -> None:
    install = await insert_pack_install(conn)
    key = await insert_link(conn, install)
    for _ in range(PATCHES_SHOWN + 5):
        await set_status(conn, "patch", await insert_patch(conn, link_key=key), "superseded")
    newest = await key_view(conn, key, all_patches=False)
    every = await key_view(conn, key, all_patches=True)
    assert (len(newest["patches"]), newest["patches_total"]) == (PATCHES_SHOWN, PATCHES_SHOWN + 5)
    assert len(every["patches"]) == PATCHES_SHOWN + 5
    assert [p["patch_id"] for p in every["patches"][-PATCHES_SHOWN:]] == [
        p["patch_id"] for p in newest["patches"]
    ]
    assert newest["link"]["link_key"] == key and newest["park_reason"] is None


async def test_a_parked_create_without_a_link_is_found_and_explained(
    conn: asyncpg.Connection,
) -> None:
    install = await insert_pack_install(conn)
    key = new_link_key()
    attempt_id = await insert_attempt(conn, install, link_key=key)
    await set_status(conn, "attempt", attempt_id, "terminal_failed")
    shown = await key_view(conn, key, all_patches=False)
    assert shown["link"] is None and shown["park_reason"] == "terminal_failed"
    assert [a["status"] for a in shown["attempts"]] == ["terminal_failed"]
    [found] = [f async for f in find(conn, key[-12:], None, None)]  # its source record id
    assert (found["link_key"], found["park_reason"]) == (key, "terminal_failed")
    parked = find(conn, None, None, ParkReason.TERMINAL_FAILED)
    assert [f["link_key"] async for f in parked] == [key]
    assert [f async for f in find(conn, None, None, ParkReason.DRIFT)] == []
    [facts] = await link_search.link_facts(conn, [key])
    assert (facts["source_object"], facts["action_slot_id"]) == ("Contact", "action-1")
