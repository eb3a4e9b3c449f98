"""The `connector-push` command: one typer app, commands registered per module."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Annotated, Final

import typer

from cli.errors import (
    ENVIRONMENT_HELP,
    EXIT_CODES_HELP,
    OneLineErrors,
    enable_debug,
    whole_lines_when_piped,
)
from cli.local_stack import has_local_stack

app = typer.Typer(
    name="connector-push",
    help="Durable CRM-to-remote connector push runtime.",
    no_args_is_help=True,
    add_completion=False,
    cls=OneLineErrors,
    epilog=EXIT_CODES_HELP,
)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version  # the installed distribution's: pyproject.toml

        typer.echo(f"connector-push {version('connector-push')}")
        raise typer.Exit


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="show tracebacks (also CONNECTOR_PUSH_DEBUG=1)")
    ] = False,
    _version: Annotated[
        bool,
        typer.Option(
            "--version", help="print the version and exit", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Durable CRM-to-remote connector push runtime (see README.md)."""
    if debug:
        enable_debug()
    from worker.gc_policy import apply_gc_policy  # stdlib only: the CLI still starts light

    apply_gc_policy()  # bulk commands allocate per page; the collector's default costs ~20%


def _with_codes(epilog: str | None) -> str:
    if epilog and "Exit codes:" in epilog:  # its own, more precise (revalidate, backfill)
        return f"{epilog}\n\n{ENVIRONMENT_HELP}"
    return f"{epilog}\n\n{EXIT_CODES_HELP}" if epilog else EXIT_CODES_HELP


def _finish_commands(typer_app: typer.Typer) -> None:
    """Every command's help lists the environment variables and exit codes, and every
    command's body prints whole lines when piped (`whole_lines_when_piped`)."""
    for command in typer_app.registered_commands:
        command.epilog = _with_codes(command.epilog)
        if command.callback is not None:
            command.callback = whole_lines_when_piped(command.callback)
    group_body = typer_app.registered_callback
    if group_body is not None and group_body.callback is not None:  # e.g. `dev` itself
        group_body.callback = whole_lines_when_piped(group_body.callback)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            group.epilog = _with_codes(group.epilog)
            _finish_commands(group.typer_instance)


# Each command module exposes `register(app)`, and no module does work at import time.
# The modules in `--help` order, each with the top-level names it registers (checked
# against the modules themselves by tests/unit/test_cli_registry.py). `dev` and `sandbox`
# are the local stack's (cli/stack/), which the wheel leaves out with the sandbox remote:
# they are commands only in a checkout's dev install (tests/e2e/test_wheel.py).
_DEV_ONLY: Final = frozenset({"stack.dev_cmd", "stack.sandbox_cmd"})
_ALL_COMMAND_MODULES: Final = {
    "stack.dev_cmd": ("dev",),
    "worker_cmd": ("worker",),
    "migrate_cmd": ("migrate",),
    "pack_cmd": ("pack",),
    "records_cmd": ("records",),
    "stack.sandbox_cmd": ("sandbox",),
    "ingress_cmd": ("ingress",),
    "link_key": ("link-key",),
    "link_cmds": ("save", "links", "attempts"),
    "push_cmd": ("push",),
    "operator_cmds": ("supersede", "reconcile", "retire", "mark-terminal", "revalidate-link"),
    "revalidate_cmd": ("revalidate",),
    "backfill_cmd": ("backfill",),
    "audit_cmd": ("audit",),
    "prune_cmd": ("prune",),
    "forget_cmd": ("forget",),
    "status_cmd": ("status",),
}
COMMAND_MODULES: Final = {
    module: names
    for module, names in _ALL_COMMAND_MODULES.items()
    if module not in _DEV_ONLY or has_local_stack()
}
_MODULE_OF: Final = {name: module for module, names in COMMAND_MODULES.items() for name in names}


def modules_for(argv: Sequence[str]) -> list[str]:
    """The command modules a process started with `argv` needs: the one that registers
    the command it names first (`connector-push status ...`), else all of them (`--help`,
    an option first, a mistyped name, a test importing the app). Typer builds the click
    tree from every registered command's signature on each start (0.1-0.3 s of CPU), and
    a listing's or `status`'s wall time is mostly that start."""
    module = _MODULE_OF.get(argv[1]) if len(argv) > 1 else None
    return [module] if module is not None else list(COMMAND_MODULES)


def _register(modules: Sequence[str]) -> None:
    for name in modules:
        importlib.import_module(f"cli.{name}").register(app)
    _finish_commands(app)


_register(modules_for(sys.argv))
