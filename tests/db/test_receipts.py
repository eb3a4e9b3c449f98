"""STO-4: the revalidation receipt table is append-only."""

from __future__ import annotations

import asyncpg
import pytest

from db.errors import AppendOnlyViolationError, invariant_errors
from tests.db.rows import insert_link, insert_pack_install


async def _receipt(conn: asyncpg.Connection) -> str:
    pack_install_id = await insert_pack_install(conn)
    link_key = await insert_link(conn, pack_install_id)
    await conn.execute(
        """
        INSERT INTO connector_link_revalidation_receipt (
            operation_id, link_key, manifest_digest, approval_digest,
            mapping_fingerprint_algorithm, body_fingerprint_algorithm,
            old_mapping_fingerprint, new_mapping_fingerprint,
            old_body_fingerprint, new_body_fingerprint,
            old_pack_install_id, new_pack_install_id, before_row_digest, after_row_digest
        ) VALUES ('op-1', $1, 'md', 'ad', 'mf-v1', 'bf-v1', 'mf1', 'mf2', 'bf1', 'bf2',
                  $2, $2, 'before', 'after')
        """,
        link_key,
        pack_install_id,
    )
    return link_key


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE connector_link_revalidation_receipt SET new_body_fingerprint = 'forged'",
        "DELETE FROM connector_link_revalidation_receipt",
        "TRUNCATE connector_link_revalidation_receipt CASCADE",
    ],
)
async def test_receipts_reject_rewrites(db_pool: asyncpg.Pool, statement: str) -> None:
    async with db_pool.acquire() as conn:
        await _receipt(conn)
        with pytest.raises(AppendOnlyViolationError), invariant_errors():
            await conn.execute(statement)
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM connector_link_revalidation_receipt"
                " WHERE new_body_fingerprint = 'bf2'"
            )
            == 1
        )


async def test_a_link_points_only_at_its_own_receipts(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        link_key = await _receipt(conn)
        await conn.execute(
            "UPDATE connector_remote_link SET last_mapping_revalidation_operation_id = 'op-1',"
            " mapping_fingerprint = 'mf2', body_fingerprint = 'bf2' WHERE link_key = $1",
            link_key,
        )
        other = await insert_link(conn, await insert_pack_install(conn))
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await conn.execute(
                "UPDATE connector_remote_link SET last_mapping_revalidation_operation_id = 'op-1'"
                " WHERE link_key = $1",
                other,
            )
