"""The pack manifest's field types (SPEC PACK-1): what each string or status may hold.

Each is an annotated type whose validator names the rule it enforces; the models in
`protocol.manifest` only compose them.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import AfterValidator, Field

from protocol.identity import check_part
from protocol.jsonpath import parse_id_path
from protocol.templates import (
    CREATE_PLACEHOLDERS,
    LOOKUP_PLACEHOLDERS,
    UPDATE_PLACEHOLDERS,
    check_template,
)


def _stable_id(value: str) -> str:
    return check_part("id", value)


def _create_path(value: str) -> str:
    check_template(value, CREATE_PLACEHOLDERS, frozenset())
    return value


def _update_path(value: str) -> str:
    check_template(value, UPDATE_PLACEHOLDERS, frozenset({"remoteId"}))
    return value


def _lookup_path(value: str) -> str:
    check_template(value, LOOKUP_PLACEHOLDERS, frozenset({"locator"}))
    return value


def _id_path(value: str) -> str:
    parse_id_path(value)
    return value


def _base_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or value.endswith("/"):
        raise ValueError("must be an http(s) URL without a trailing '/'")
    # Any '@', not only one in the authority: an unencoded '/' in a password moves the
    # userinfo into the path. Like credentialRef's, the value itself is never echoed.
    if "@" in value:
        raise ValueError(
            "must not hold user information (user:password@): a credential belongs in "
            "credentialRef, never in the URL (value not shown)"
        )
    return value


# A profile names its credential, never holds it (STO-3): `<scheme>:<NAME>` with a scheme
# the runtime resolves. `env:NAME` is read from `CONNECTOR_PUSH_CREDENTIAL_ENV_<NAME>`.
CREDENTIAL_REF_SCHEMES: Final = frozenset({"env"})
_CREDENTIAL_REF: Final = re.compile(r"([a-z][a-z0-9]*):([A-Za-z_][A-Za-z0-9_]{0,127})")


def is_credential_ref(value: str) -> bool:
    """`value` is a reference in a declared scheme (so it may be shown; a secret may not)."""
    match = _CREDENTIAL_REF.fullmatch(value)
    return match is not None and match.group(1) in CREDENTIAL_REF_SCHEMES


def _credential_ref(value: str) -> str:
    if not is_credential_ref(value):
        # The value itself is never echoed: it may be the very token that was pasted.
        schemes = ", ".join(f"{s}:NAME" for s in sorted(CREDENTIAL_REF_SCHEMES))
        raise ValueError(
            f"must be a credential reference ({schemes}), not a secret (value not shown)"
        )
    return value


StableId = Annotated[str, AfterValidator(_stable_id)]
CredentialRef = Annotated[str, AfterValidator(_credential_ref)]
NonEmpty = Annotated[str, Field(min_length=1)]
CreatePath = Annotated[str, AfterValidator(_create_path)]
UpdatePath = Annotated[str, AfterValidator(_update_path)]
LookupPath = Annotated[str, AfterValidator(_lookup_path)]
ResponseIdPath = Annotated[str, AfterValidator(_id_path)]


def _http_error_status(value: int) -> int:
    if not 400 <= value <= 599:
        raise ValueError("must be an HTTP error status (400-599)")
    return value


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as error:
        raise ValueError(f"not a regular expression: {error}") from error
    return value


def _time_zone(value: str) -> str:
    # The zone whose midnight resets a daily quota (IANA name).
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ValueError(
            f"not an IANA time zone name like UTC or America/New_York: {value!r}"
        ) from error
    return value


HttpErrorStatus = Annotated[int, AfterValidator(_http_error_status)]
TimeZoneName = Annotated[str, AfterValidator(_time_zone)]
BaseUrl = Annotated[str, AfterValidator(_base_url)]
Regex = Annotated[str, AfterValidator(_regex)]
