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
   integers and Python's int/str conversions never refuse it; a float (from the
   YAML and JSON parsers of the CLI's files) is finite, as JSON has no NaN or
   infinity: `number_out_of_range`.
4. A document nests at most `MAX_DEPTH` arrays and objects, so serialising it
   again never runs out of stack: `nesting_too_deep`.
"""

from __future__ import annotations

import math
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


MEANINGS: Final = {
    Unstorable.UNENCODABLE_STRING: "a lone surrogate (such as \\ud800) is not UTF-8 text",
    Unstorable.NUL_IN_TEXT: "a NUL character (\\u0000) cannot be stored as text",
    Unstorable.NUMBER_OUT_OF_RANGE: (
        f"NaN, infinities and numbers past {MAX_DIGITS} digits or exponent "
        f"±{MAX_EXPONENT} cannot be stored"
    ),
    Unstorable.NESTING_TOO_DEEP: f"nested deeper than {MAX_DEPTH} arrays and objects",
}

# Where in a document: object keys and array indexes from the top.
Location = tuple[str | int, ...]


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
    if type(value) is float and not math.isfinite(value):
        return Unstorable.NUMBER_OUT_OF_RANGE
    return None


def unstorable_reason(document: object) -> Unstorable | None:
    """The first reason the document (from `parse_exact_json`) cannot be stored, or None."""
    found = unstorable_at(document)
    return None if found is None else found[1]


def unstorable_at(document: object) -> tuple[Location, Unstorable] | None:
    """Where the first reason the document cannot be stored is, and that reason; or None.

    Iterative, so a deep document is refused by rule 4 rather than by the stack.
    """
    if type(document) is not dict and type(document) is not list:
        problem = _scalar_problem(document)
        return None if problem is None else ((), problem)
    # Containers wait on a stack with their location; scalars are checked on sight.
    pending: list[tuple[object, Location]] = [(document, ())]
    while pending:
        container, where = pending.pop()
        if len(where) >= MAX_DEPTH:
            return where, Unstorable.NESTING_TOO_DEEP
        if type(container) is dict:
            for key in container:
                if (problem := _scalar_problem(key)) is not None:
                    return (*where, key), problem
            steps: Iterable[tuple[str | int, object]] = container.items()
        elif type(container) is list:
            steps = enumerate(container)
        else:  # only dicts and lists are stacked
            continue
        for step, item in steps:
            if type(item) is dict or type(item) is list:
                pending.append((item, (*where, step)))
            elif (problem := _scalar_problem(item)) is not None:
                return (*where, step), problem
    return None


def location_text(where: Location) -> str:
    """`records[0].fields.name` (a key that is not a plain name in brackets, as repr)."""
    text = "".join(
        f"[{step}]"
        if isinstance(step, int)
        else f".{step}"
        if step.isidentifier()
        else f"[{step!r}]"
        for step in where
    )
    return text.lstrip(".") or "document"
