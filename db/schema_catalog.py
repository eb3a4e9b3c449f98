"""The schema as a sorted list of items (STO-5, MIG-1): what two databases must share to
be the same schema, compared by the migration runner's tests and by the release's squash
(scripts/squash_migrations.py, which refuses a baseline whose schema differs)."""

from __future__ import annotations

from typing import Final

import asyncpg

# Columns, indexes, constraints, triggers (and whether enabled), functions (body, owner,
# grants, settings), relations (kind, owner, grants, options), column grants, comments and
# the schema's own grants; the runner's ledger is left out.
SCHEMA_ITEMS: Final = """
SELECT 'column', table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable
       || ' ' || coalesce(column_default, '')
  FROM information_schema.columns
 WHERE table_schema = 'public' AND table_name <> 'schema_migration'
UNION ALL SELECT 'index', indexdef FROM pg_indexes
 WHERE schemaname = 'public' AND tablename <> 'schema_migration'
UNION ALL SELECT 'constraint', conrelid::regclass || ' ' || conname || ' '
       || pg_get_constraintdef(oid) FROM pg_constraint
 WHERE connamespace = 'public'::regnamespace AND conrelid <> 'schema_migration'::regclass
UNION ALL SELECT 'trigger', tgrelid::regclass || ' ' || pg_get_triggerdef(oid)
       || ' ' || tgenabled::text
  FROM pg_trigger WHERE NOT tgisinternal
UNION ALL SELECT 'function', p.oid::regprocedure || ' ' || md5(prosrc) || ' '
       || pg_get_userbyid(proowner) || ' ' || coalesce(proacl::text, '')
       || ' ' || coalesce(proconfig::text, '') || ' ' || provolatile::text || prosecdef::text
  FROM pg_proc p WHERE pronamespace = 'public'::regnamespace
UNION ALL SELECT 'relation', c.oid::regclass || ' ' || c.relkind::text || ' '
       || pg_get_userbyid(c.relowner) || ' ' || coalesce(c.relacl::text, '')
       || ' ' || coalesce(c.reloptions::text, '')
  FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
   AND c.relname NOT LIKE 'schema_migration%'
UNION ALL SELECT 'column acl', attrelid::regclass || '.' || attname || ' ' || attacl::text
  FROM pg_attribute WHERE attacl IS NOT NULL
   AND attrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
UNION ALL SELECT 'comment', objoid::regclass || ' ' || objsubid || ' ' || md5(description)
  FROM pg_description WHERE classoid = 'pg_class'::regclass
   AND objoid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
UNION ALL SELECT 'schema acl', coalesce(nspacl::text, '') FROM pg_namespace
 WHERE nspname = 'public'
ORDER BY 1, 2
"""


async def schema_items(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    """The schema of `conn`'s database, item by item, sorted."""
    return [(row[0], row[1]) for row in await conn.fetch(SCHEMA_ITEMS)]
