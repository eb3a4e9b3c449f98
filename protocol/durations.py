"""Durations a pack declares (SPEC G-5 `keyRetention`): whole seconds, read from seconds
(`86400`), a number with one unit (`90s`, `30m`, `24h`, `7d`) or an ISO-8601 duration of
days and time (`PT24H`, `P1DT12H`). Months and years are refused: their length varies.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import BeforeValidator, Field

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_WITH_UNIT: Final = re.compile(r"(\d{1,9})\s*([smhd])")
_ISO: Final = re.compile(r"P(?:(\d{1,9})D)?(?:T(?:(\d{1,9})H)?(?:(\d{1,9})M)?(?:(\d{1,9})S)?)?")
# A remote that keeps keys longer than a month is not one to count on (G-5).
MAX_KEY_RETENTION_S: Final = 30 * 86_400
_FORMS: Final = "seconds (86400), a number with a unit (90s, 30m, 24h, 7d) or ISO-8601 (PT24H)"


def duration_seconds(value: object) -> object:
    """Whole seconds of a declared duration; anything else is left to fail as not an int."""
    if isinstance(value, bool):
        raise ValueError(f"expected {_FORMS}, got {value!r}")
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.isdigit():
        return int(text)
    if unit := _WITH_UNIT.fullmatch(text):
        return int(unit.group(1)) * _UNITS[unit.group(2)]
    iso = _ISO.fullmatch(text.upper())
    if iso is None or not any(iso.groups()) or text.upper().endswith("T"):
        raise ValueError(f"expected {_FORMS}, got {value!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in iso.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


KeyRetentionSeconds = Annotated[
    int, BeforeValidator(duration_seconds), Field(ge=1, le=MAX_KEY_RETENTION_S)
]
