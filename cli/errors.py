"""One way for commands to fail: a one-line message on stderr and a documented exit code.

Exit codes (listed in every command's help, see `EXIT_CODES_HELP`):
  0  done
  1  refused or failed (the action does not apply, a service stopped, an internal error)
  2  bad input: arguments, a key, a file (nothing was written)
  3  rejected: the save, backfill or revalidation decision said no (its reason printed)
  4  already applied (`revalidate apply` of an applied manifest)
  5  a dependency is unreachable or its setting is wrong (Postgres, Temporal)

`--debug` (or `CONNECTOR_PUSH_DEBUG=1`) shows the traceback instead of the line.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

EXIT_FAILED: Final = 1
EXIT_BAD_INPUT: Final = 2
EXIT_REJECTED: Final = 3
EXIT_UNAVAILABLE: Final = 5
DEBUG_ENV: Final = "CONNECTOR_PUSH_DEBUG"
PIPED_COLUMNS: Final = 10_000

ENVIRONMENT_HELP: Final = (
    "Environment: DATABASE_URL, TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, "
    "CONNECTOR_PUSH_TASK_QUEUE; CONNECTOR_PUSH_DEBUG=1 (or --debug) shows tracebacks."
)
EXIT_CODES_HELP: Final = (
    "Exit codes: 0 done; 1 refused or failed; 2 bad input (nothing written); 3 rejected; "
    "4 already applied; 5 Postgres or Temporal unreachable or misconfigured. " + ENVIRONMENT_HELP
)

_stderr = Console(stderr=True, soft_wrap=True)


class CliError(Exception):
    """An error already phrased for the user: one line and its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


_S = TypeVar("_S", bound="BaseSettings")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def load_settings(model: type[_S]) -> _S:
    """`model()` from the environment, or exit 5 naming the variable that broke its rule
    (never its value: DSNs and keys are secrets)."""
    from pydantic import ValidationError  # only commands that read settings pay for it

    try:
        return model()
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "environment"
        field = model.model_fields.get(name)
        alias = field.validation_alias if field else None
        prefix = model.model_config.get("env_prefix", "")
        variable = alias if isinstance(alias, str) else f"{prefix}{name}".upper()
        raise CliError(
            f"{variable}: {first['msg'].removeprefix('Value error, ')}; "
            "fix the variable (values are not shown)",
            EXIT_UNAVAILABLE,
        ) from None


def required_text(option: str, value: str) -> str:
    """`value`, or exit 2 naming `option` when it is empty or only whitespace: who acts and
    why are recorded on rows and in the audit trail, where a blank says nothing."""
    if not value.strip():
        raise CliError(f"{option} must not be empty or blank", EXIT_BAD_INPUT)
    return value


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in {"", "0", "false", "no"}


def enable_debug() -> None:
    os.environ[DEBUG_ENV] = "1"


def print_error(message: str) -> None:
    """`message` is rich markup (escape user text); printed as one line, never wrapped."""
    _stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    print_error(message)
    raise typer.Exit(code)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


@contextmanager
def _whole_lines_when_piped() -> Iterator[None]:
    """Piped, rich folds tables and values to 80 columns; scripts need them whole.

    rich reads `COLUMNS` when it measures; set for the command only (tests run many).
    """
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        yield
        return
    os.environ["COLUMNS"] = str(PIPED_COLUMNS)
    try:
        yield
    finally:
        os.environ.pop("COLUMNS", None)


def whole_lines_when_piped(callback: Callable[_P, _R]) -> Callable[_P, _R]:
    """`callback` (a command's body) with piped output unfolded. Only the body: `--help`
    is printed while the arguments are parsed, before it, and stays at rich's 80 columns
    (10,000 made a piped subcommand's help a quarter megabyte of box drawing)."""

    @functools.wraps(callback)
    def body(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _whole_lines_when_piped():
            return callback(*args, **kwargs)

    return body


def _require_utf8(arguments: list[str]) -> None:
    """Python decodes argv bytes that are not UTF-8 into lone surrogates, which no
    database, file name or remote can take: refuse them, naming the argument."""
    for position, argument in enumerate(arguments, 1):
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError as error:
            code = ord(argument[error.start])
            # surrogateescape maps an undecodable byte b to U+DC00 + b (b >= 0x80).
            what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
            print_error(
                f"argument {position} is not valid UTF-8 ({what} at character "
                f"{error.start + 1}); pass text, nothing was done"
            )
            raise SystemExit(EXIT_BAD_INPUT) from None


def _schema_missing(exc: Exception) -> bool:
    """asyncpg's UndefinedTableError, without importing asyncpg: a command that never
    imported it cannot have raised it (the CLI starts fast without it)."""
    asyncpg_exceptions = sys.modules.get("asyncpg.exceptions")
    missing = getattr(asyncpg_exceptions, "UndefinedTableError", None)
    return isinstance(missing, type) and isinstance(exc, missing)


class OneLineErrors(TyperGroup):
    """The root group: any exception a command lets escape becomes one line and a code."""

    def main(self, args: Any = None, *rest: Any, **options: Any) -> Any:
        """Refuse arguments that are not text before any command sees them (exit 2)."""
        _require_utf8(sys.argv[1:] if args is None else list(args))
        return super().main(args, *rest, **options)

    # `Any`: typer types this with its vendored click's Context, which it does not export.
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # usage errors and exits: typer prints and exits as it documents
        except CliError as error:
            if debug_enabled():
                raise
            print_error(escape(error.message))
            raise typer.Exit(error.code) from None
        except Exception as exc:
            if debug_enabled():
                raise
            if _schema_missing(exc):  # whichever query found the schema missing
                print_error(escape(f"{exc}: run `connector-push migrate` first"))
                raise typer.Exit(EXIT_UNAVAILABLE) from None
            print_error(
                escape(f"unexpected error: {_one_line(exc)}")
                + f" (rerun with --debug or {DEBUG_ENV}=1 for the traceback)"
            )
            raise typer.Exit(EXIT_FAILED) from None
