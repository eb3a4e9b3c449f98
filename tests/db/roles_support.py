"""Log in as one process's database role (S-4): a test LOGIN granted exactly that role.

Migration 0220 creates NOLOGIN group roles; a deployment grants each to the login its
process connects with (docs/deployment.md). The tests do the same, once per server
(roles are cluster-wide), with the embedded server's trust authentication.
"""

from __future__ import annotations

from typing import Final, Literal
from urllib.parse import urlsplit

import asyncpg

Role = Literal["migrator", "worker", "operator", "save_api", "ingress"]
APPLICATION_ROLES: Final[tuple[Role, ...]] = ("worker", "operator", "save_api", "ingress")


def group_role(role: Role) -> str:
    return f"connector_push_{role}"


def login_name(role: Role) -> str:
    return f"cp_test_login_{role}"


async def login_dsn(dsn: str, role: Role) -> str:
    """`dsn` (a superuser's) with its user replaced by a login granted only `role`."""
    login = login_name(role)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"""
            DO $login$ BEGIN
                CREATE ROLE {login} LOGIN IN ROLE {group_role(role)};
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
            END $login$
            """
        )
    finally:
        await conn.close()
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{login}@{host}").geturl()
