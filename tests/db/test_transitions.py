"""ARCH-3: the database's status guards equal the `protocol/` transition tables."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from itertools import permutations

import asyncpg
import pytest

from db.errors import IllegalInitialStatusError, IllegalTransitionError, invariant_errors
from db.transition_sql import BEGIN_MARKER, newest_generated_migration, render_transition_sql
from protocol.states import LIFECYCLES
from tests.db.rows import (
    insert_attempt,
    insert_event,
    insert_link,
    insert_pack_install,
    insert_patch,
    new_link_key,
    path_to,
    set_status,
)

RowFactory = Callable[[str], Awaitable[object]]


async def _row_factory(conn: asyncpg.Connection, lifecycle: str) -> RowFactory:
    """A function inserting one row of `lifecycle` in the given status; returns its key."""
    if lifecycle == "event":
        return lambda status: insert_event(conn, status=status)
    pack_install_id = await insert_pack_install(conn)
    if lifecycle == "link":
        return lambda status: insert_link(conn, pack_install_id, status=status)
    if lifecycle == "attempt":
        return lambda status: insert_attempt(
            conn, pack_install_id, link_key=new_link_key(), status=status
        )
    parent = await insert_link(conn, pack_install_id)
    return lambda status: insert_patch(conn, link_key=parent, status=status)


def test_committed_migration_holds_the_current_render() -> None:
    migration = newest_generated_migration()
    text = migration.read_text()
    assert text.count(BEGIN_MARKER) == 1
    assert render_transition_sql() in text, (
        f"{migration.name} is stale: run `python -m db.transition_sql --new NNNN_name` "
        "(or --write while the migration is unreleased)"
    )


@pytest.mark.parametrize("lifecycle", list(LIFECYCLES))
async def test_every_status_pair_is_accepted_exactly_when_the_protocol_allows_it(
    db_dsn: str, lifecycle: str
) -> None:
    _, states, table, initial = LIFECYCLES[lifecycle]
    conn = await asyncpg.connect(db_dsn)
    try:
        insert = await _row_factory(conn, lifecycle)
        mismatches = []
        for source, target in permutations(list(states), 2):
            accepted = await _try_transition(
                conn, lifecycle, insert, table, initial, source, target
            )
            if accepted != (target in table[source]):
                mismatches.append(f"{source} -> {target}: database accepted={accepted}")
    finally:
        await conn.close()
    assert mismatches == []


async def _try_transition(
    conn: asyncpg.Connection,
    lifecycle: str,
    insert: RowFactory,
    table: Mapping[StrEnum, frozenset[StrEnum]],
    initial: StrEnum,
    source: StrEnum,
    target: StrEnum,
) -> bool:
    """Walk a fresh row legally to `source`, then try `target`; all rolled back."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        key = await insert(initial.value)
        for step in path_to(table, initial, source):
            assert await set_status(conn, lifecycle, key, step.value) == "UPDATE 1"
        try:
            with invariant_errors():
                tag = await set_status(conn, lifecycle, key, target.value)
        except IllegalTransitionError as exc:
            assert (exc.lifecycle, exc.from_status, exc.to_status) == (
                lifecycle,
                source.value,
                target.value,
            )
            return False
        assert tag == "UPDATE 1"
        return True
    finally:
        await transaction.rollback()


@pytest.mark.parametrize("lifecycle", list(LIFECYCLES))
async def test_rows_are_born_in_the_initial_state_only(db_dsn: str, lifecycle: str) -> None:
    _, states, _, initial = LIFECYCLES[lifecycle]
    conn = await asyncpg.connect(db_dsn)
    try:
        insert = await _row_factory(conn, lifecycle)
        await insert(initial.value)
        for state in states:
            if state == initial:
                continue
            with pytest.raises(IllegalInitialStatusError) as caught, invariant_errors():
                await insert(state.value)
            assert (caught.value.lifecycle, caught.value.status) == (lifecycle, state.value)
    finally:
        await conn.close()


@pytest.mark.parametrize("lifecycle", list(LIFECYCLES))
async def test_rewriting_the_same_status_is_not_a_transition(db_dsn: str, lifecycle: str) -> None:
    _, _, _, initial = LIFECYCLES[lifecycle]
    conn = await asyncpg.connect(db_dsn)
    try:
        key = await (await _row_factory(conn, lifecycle))(initial.value)
        assert await set_status(conn, lifecycle, key, initial.value) == "UPDATE 1"
    finally:
        await conn.close()


async def test_a_raw_transition_violation_carries_its_own_sqlstate(db_dsn: str) -> None:
    conn = await asyncpg.connect(db_dsn)
    try:
        key = await (await _row_factory(conn, "attempt"))("pending")
        with pytest.raises(asyncpg.PostgresError) as caught:
            await set_status(conn, "attempt", key, "finalized")
        assert caught.value.sqlstate == "CP001"
        assert "attempt: illegal transition pending -> finalized" in str(caught.value)
    finally:
        await conn.close()
