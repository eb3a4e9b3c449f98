"""Pages of a listing (NF-7): `links list`, `links find`, `attempts list` and
`audit` read one page at a time by keyset (`--after CURSOR`, never OFFSET), print it as
a table or as JSON Lines, and say on stderr how to get the next page.

A cursor is opaque to the caller and stable: the sort key of the page's last row (a
time and a key, a link key, an audit id) with the listing's name, base64url-encoded, so
the next page starts right after that row whatever was written since. A cursor from one
listing is refused by another (exit 2).

With `--json`, stdout carries only rows, one JSON object per line, written as they are
read; when there are more, stderr gets one JSON object `{"next_cursor": ..,
"next_command": ..}`. A table is followed by the same news as one line on stderr.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shlex
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from datetime import datetime
from typing import Annotated, Any, Final, NoReturn, TypeVar
from uuid import UUID

import typer
from rich.console import Console

from cli.database import bad_input

T = TypeVar("T")
_stderr = Console(stderr=True, highlight=False, soft_wrap=True)
PROGRAM: Final = "connector-push"

After = Annotated[
    str | None,
    typer.Option(
        "--after",
        metavar="CURSOR",
        help="start after this cursor: the one the previous page printed on stderr",
    ),
]


def encode_cursor(listing: str, *key: str | int) -> str:
    raw = json.dumps([listing, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _refuse(text: str) -> NoReturn:
    bad_input(f"--after {text!r}: not a cursor of this listing (give the one its page printed)")


def _decode(text: str, listing: str, types: Sequence[type]) -> list[Any]:
    """The key a cursor of `listing` names, each part of its type; any other text is bad
    input (exit 2), never a query error: text keys are printable ASCII (link keys, ids)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeError, RecursionError):
        _refuse(text)
    if not isinstance(value, list) or value[:1] != [listing] or len(value) != len(types) + 1:
        _refuse(text)
    key = value[1:]
    if not all(type(v) is t for v, t in zip(key, types, strict=True)):
        _refuse(text)
    if not all(v.isascii() and v.isprintable() for v in key if isinstance(v, str)):
        _refuse(text)
    return key


def time_key_cursor(text: str | None, listing: str) -> tuple[datetime, str] | None:
    """(created_at, key) of the row a page starts after; None for the first page."""
    if text is None:
        return None
    when, key = _decode(text, listing, (str, str))
    try:
        at = datetime.fromisoformat(when)
    except ValueError:
        _refuse(text)
    if at.tzinfo is None:
        _refuse(text)
    return at, key


def uuid_cursor(text: str | None, listing: str) -> tuple[datetime, UUID] | None:
    if text is None:
        return None
    at, key = time_key_cursor(text, listing) or _refuse(text)
    try:
        return at, UUID(key)
    except ValueError:
        _refuse(text)


def text_cursor(text: str | None, listing: str) -> str | None:
    return None if text is None else str(_decode(text, listing, (str,))[0])


def int_cursor(text: str | None, listing: str) -> int | None:
    """An id below which a page starts (a Postgres bigint)."""
    if text is None:
        return None
    value = int(_decode(text, listing, (int,))[0])
    if not 0 < value < 2**63:
        _refuse(text)
    return value


async def take(rows: AsyncGenerator[T], limit: int, emit: Callable[[T], None]) -> T | None:
    """Hand the first `limit` of `rows` to `emit` as they come (a source yields at most
    `limit + 1`); the last row emitted when one more exists (the page is cut after it),
    else None."""
    last: T | None = None
    emitted = 0
    async with aclosing(rows):  # a source's transaction ends here, whatever was read
        async for row in rows:
            if emitted == limit:
                return last
            emit(row)
            last, emitted = row, emitted + 1
    return None


def json_line(row: dict[str, Any]) -> None:
    """One row as one line of JSON on stdout (JSON Lines), written now. A reader that
    stopped reading (`| head -1`) ends the listing quietly (exit 0), as a Unix filter's
    reader would expect, not with a BrokenPipeError traceback."""
    try:
        sys.stdout.write(json.dumps(row, default=str) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None


def say_more(command: Sequence[str], cursor: str, as_json: bool, named_database: bool) -> None:
    """On stderr: there are more rows, and the command that prints the next page (every
    option as given but `--database-url`, which may hold a password and is never printed)."""
    next_command = shlex.join([PROGRAM, *command, "--after", cursor])
    if as_json:
        print(json.dumps({"next_cursor": cursor, "next_command": next_command}), file=sys.stderr)
        return
    also = " (with your --database-url)" if named_database else ""
    _stderr.print(f"more rows; the next page: {next_command}{also}", markup=False)
