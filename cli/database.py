"""What database commands share: the `--database-url` option, one connection, input files."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final, NoReturn

import typer
from rich.markup import escape

from cli.dsn import ENCODE_HINT, describe_dsn
from cli.errors import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, CliError, fail
from cli.local_stack import local_stack_config

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    import asyncpg
    import yaml

CONNECT_TIMEOUT_S: Final = 10.0
# No pack, records file or manifest comes near this; a file past it is a mistake.
MAX_INPUT_BYTES: Final = 256 * 2**20

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Postgres DSN (default: $DATABASE_URL; in a checkout, temporal-dev.yaml's dev DSN)",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]

# Where each resolved DSN came from, so a connection error names the setting to fix.
_DSN_SOURCES: dict[str, str] = {}


def resolve_dsn(database_url: str | None) -> str:
    if database_url:
        dsn, source = database_url, "--database-url"
    elif env := os.environ.get("DATABASE_URL"):
        dsn, source = env, "$DATABASE_URL"
    elif (local := local_stack_config()) is not None:
        dsn, source = local.postgres.dsn(), "postgres.* in temporal-dev.yaml"
    else:
        raise CliError(
            "no database given: set $DATABASE_URL or pass --database-url", EXIT_UNAVAILABLE
        )
    _DSN_SOURCES[dsn] = source
    return dsn


def _unparseable(source: str) -> CliError:
    # No parser text: asyncpg's messages quote the part it choked on, which may be the
    # password (an unencoded '/' or '?' in it moves the rest into the port or the query).
    return CliError(
        f"{source} cannot be parsed as a Postgres URL "
        f"(postgresql://user:password@host:port/database; {ENCODE_HINT}); "
        f"fix {source} (its value is not shown)",
        EXIT_UNAVAILABLE,
    )


def _detail(exc: BaseException, parts_known: bool) -> str:
    """Why the connection failed; the server's or the OS's text only when the DSN's parts
    are unambiguous (else it may quote a database or host name cut from the password)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    if not parts_known:
        strerror = exc.strerror if isinstance(exc, OSError) else None
        return strerror or type(exc).__name__
    return " ".join(str(exc).split()) or type(exc).__name__


def postgres_error(
    dsn: str, exc: BaseException, source: str | None = None, fix: str | None = None
) -> CliError:
    """One line: what failed, the setting it came from, what to do (exit 5); never any
    part of the password (`cli/dsn.py`)."""
    source = source or _DSN_SOURCES.get(dsn, "$DATABASE_URL")
    if isinstance(exc, ValueError | OverflowError):  # asyncpg could not parse the DSN
        return _unparseable(source)
    address = describe_dsn(dsn)
    where = (
        f"at {address} (from {source})"
        if address is not None
        else f"(from {source}; its address is not shown: {ENCODE_HINT})"
    )
    return CliError(
        f"cannot reach Postgres {where}: {_detail(exc, address is not None)}; "
        + (fix or f"start it with `make dev` or fix {source}"),
        EXIT_UNAVAILABLE,
    )


async def connect_postgres(dsn: str) -> asyncpg.Connection:
    """`asyncpg.connect`, bounded in time; any failure is a `CliError` (exit 5)."""
    import asyncio

    import asyncpg

    from db.pool import CONNECT_ERRORS

    try:
        return await asyncio.wait_for(asyncpg.connect(dsn), CONNECT_TIMEOUT_S)
    except CONNECT_ERRORS as exc:
        raise postgres_error(dsn, exc) from None  # the cause's text may quote the password


def bad_input(message: str) -> NoReturn:
    """Report invalid input (nothing was written) and exit with `EXIT_BAD_INPUT`."""
    fail(escape(message), code=EXIT_BAD_INPUT)


@asynccontextmanager
async def open_connection(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection, closed on exit; unreachable databases become one clear error."""
    conn = await connect_postgres(dsn)
    try:
        yield conn
    finally:
        await conn.close()


# The name the commands use. An unmigrated database (UndefinedTableError, on any
# connection or pool) is one line for every command: `cli.errors.OneLineErrors`.
connect = open_connection


def _syntax_error(path: Path, exc: json.JSONDecodeError | yaml.YAMLError) -> str:
    import yaml

    if isinstance(exc, json.JSONDecodeError):
        return f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {exc.problem}"
    return f"{path}: not valid YAML: {' '.join(str(exc).split())}"


def read_text_file(path: Path, expected: str = "a YAML or JSON file") -> str:
    """A UTF-8 text file's contents; unreadable, not a regular file, over
    `MAX_INPUT_BYTES` or other bytes exit 2 (nothing done)."""
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode) and not stat.S_ISDIR(status.st_mode):
            kind = (
                "a device"
                if stat.S_ISCHR(status.st_mode) or stat.S_ISBLK(status.st_mode)
                else "a FIFO or socket"
            )
            # Read forever (/dev/zero) or until a writer comes (a FIFO): never read.
            bad_input(f"{path}: {kind}, not a file (it would be read forever); give {expected}")
        if status.st_size > MAX_INPUT_BYTES:
            bad_input(f"{path}: larger than {MAX_INPUT_BYTES // 2**20} MiB; give {expected}")
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        bad_input(f"{path}: cannot read ({exc.strerror or exc}); check the path and permissions")
    except UnicodeDecodeError as exc:
        bad_input(f"{path}: not a UTF-8 text file (byte {exc.start}); give {expected}")


def check_writable(path: Path, option: str) -> None:
    """Exit 2 now, before any work, when `path` could not be written to later."""
    where = f"{option} {path}"
    if path.is_dir():
        bad_input(f"{where}: a directory; give a file path")
    if not path.parent.is_dir():
        bad_input(f"{where}: directory {path.parent} does not exist; create it first")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        bad_input(f"{where}: not writable; check the path and permissions")


def read_document(path: Path) -> object:
    """Parse a YAML or JSON file (`.json` as JSON, anything else as YAML)."""
    import yaml

    text = read_text_file(path)
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        bad_input(_syntax_error(path, exc))
    except ValueError:  # Python's int-from-text limit (4300 digits), in either parser
        bad_input(f"{path}: a number too long to read; no pack, record or manifest holds one")
    except RecursionError:  # both parsers recurse per nesting level
        bad_input(f"{path}: nested too deeply to read; no pack, record or manifest nests so")


def echo_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))
