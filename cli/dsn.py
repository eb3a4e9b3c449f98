"""What of a Postgres DSN may be shown: its host, port and database, never its password.

A password holding an unencoded '@', '/', '?' or '#' moves part of itself into another
part of the URL (the host, the path, the query or the fragment), and parsers disagree
where: urllib splits the user information at the last '@', asyncpg at the first. So a
part is shown only when the DSN has at most one '@' and it sits inside the authority;
otherwise nothing of the address is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

SCHEMES: Final = frozenset({"postgresql", "postgres"})
ENCODE_HINT: Final = "percent-encode any '@', '/', '?' or '#' in the password"


@dataclass(frozen=True)
class DsnParts:
    """The parts of a DSN every parser reads alike (the password is only noted, not kept)."""

    scheme: str
    user: str
    has_password: bool
    hosts: str  # host[:port], as written (may be a list: h1:5432,h2:5432)
    path: str  # /database, or empty
    has_query: bool


def dsn_parts(dsn: str) -> DsnParts | None:
    """The shown parts of `dsn`, or None when it is not a postgresql:// URL or its parts
    are ambiguous (an '@' outside the authority, or more than one)."""
    scheme, separator, rest = dsn.partition("://")
    if not separator or scheme not in SCHEMES:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in tail or authority.count("@") > 1:
        return None
    userinfo, _, hosts = authority.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    path = tail.split("#", 1)[0].split("?", 1)[0]
    return DsnParts(scheme, user, bool(colon), hosts, path, "?" in tail)


def describe_dsn(dsn: str) -> str | None:
    """`host:port/database` without user or password; None when that cannot be told safely."""
    parts = dsn_parts(dsn)
    if parts is None:
        return None
    return f"{parts.hosts or 'the default host'}{parts.path}"


def mask_dsn(dsn: str) -> str:
    """The DSN with its password replaced by `***` (and its query, which may hold one, by
    `?...`); a DSN whose parts are ambiguous is not shown at all."""
    parts = dsn_parts(dsn)
    if parts is None:
        return f"(not shown: not postgresql://user:password@host/database; {ENCODE_HINT})"
    user = f"{parts.user}:***@" if parts.has_password else f"{parts.user}@" if parts.user else ""
    query = "?..." if parts.has_query else ""
    return f"{parts.scheme}://{user}{parts.hosts}{parts.path}{query}"
