"""What the database can store (SPEC NF-5), decided once at parse time for every path.

A request the database would refuse is a 400 naming the reason, with nothing
written, instead of a failed commit that a sender retries forever.

Rules kept in this module:
1. Every string of a document, object keys included, encodes as UTF-8. JSON's
   `\\ud800` escape parses to a lone surrogate, which no text column accepts:
   `unencodable_string`.
2. No string contains NUL: Postgres text and jsonb both refuse `\\u0000`, and any
   string of the event may reach a column (`event_type`, ids): `nul_in_text`.
3. A number has at most `MAX_DIGITS` significant digits and a decimal exponent
   within `MAX_EXPONENT`, so ids and scopes derived from it stay short exact
   integers and Python's int/str conversions never refuse it: `number_out_of_range`.
4. A document nests at most `MAX_DEPTH` arrays and objects, so serialising it
   again never runs out of stack: `nesting_too_deep`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal
from enum import StrEnum
from typing import Final

MAX_DIGITS: Final = 1000
MAX_EXPONENT: Final = 1000
MAX_DEPTH: Final = 64

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class Unstorable(StrEnum):
    """Why a parsed document cannot be stored (the 400's reason)."""

    UNENCODABLE_STRING = "unencodable_string"
    NUL_IN_TEXT = "nul_in_text"
    NUMBER_OUT_OF_RANGE = "number_out_of_range"
    NESTING_TOO_DEEP = "nesting_too_deep"


def string_problem(text: str) -> Unstorable | None:
    """Why this string cannot be stored in a text column, or None."""
    if "\x00" in text:
        return Unstorable.NUL_IN_TEXT
    if not text.isascii() and _SURROGATE.search(text) is not None:
        return Unstorable.UNENCODABLE_STRING
    return None


def number_problem(value: Decimal) -> Unstorable | None:
    """Why this JSON number is outside what identities and columns accept, or None."""
    if not value.is_finite() or abs(value.adjusted()) > MAX_EXPONENT:
        return Unstorable.NUMBER_OUT_OF_RANGE
    # The text is never shorter than the digits: count them only when it is long.
    if len(str(value)) > MAX_DIGITS and len(value.as_tuple().digits) > MAX_DIGITS:
        return Unstorable.NUMBER_OUT_OF_RANGE
    return None


def _scalar_problem(value: object) -> Unstorable | None:
    if type(value) is str:
        return string_problem(value)
    if type(value) is Decimal:
        return number_problem(value)
    return None


def unstorable_reason(document: object) -> Unstorable | None:
    """The first reason the document (from `parse_exact_json`) cannot be stored, or None.

    Iterative, so a deep document is refused by rule 4 rather than by the stack.
    """
    if type(document) is not dict and type(document) is not list:
        return _scalar_problem(document)
    # Containers wait on a stack with their depth; scalars are checked on sight.
    pending: list[tuple[object, int]] = [(document, 0)]
    while pending:
        container, depth = pending.pop()
        if depth >= MAX_DEPTH:
            return Unstorable.NESTING_TOO_DEEP
        if type(container) is dict:
            for key in container:
                if (problem := _scalar_problem(key)) is not None:
                    return problem
            items: Iterable[object] = container.values()
        elif type(container) is list:
            items = container
        else:  # only dicts and lists are stacked
            continue
        for item in items:
            if type(item) is dict or type(item) is list:
                pending.append((item, depth + 1))
            elif (problem := _scalar_problem(item)) is not None:
                return problem
    return None
