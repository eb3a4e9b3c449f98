"""The `connector-push` command: one typer app, commands registered per module."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.errors import (
    ENVIRONMENT_HELP,
    EXIT_CODES_HELP,
    OneLineErrors,
    enable_debug,
    whole_lines_when_piped,
)

app = typer.Typer(
    name="connector-push",
    help="Durable CRM-to-remote connector push runtime.",
    no_args_is_help=True,
    add_completion=False,
    cls=OneLineErrors,
    epilog=EXIT_CODES_HELP,
)


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="show tracebacks (also CONNECTOR_PUSH_DEBUG=1)")
    ] = False,
) -> None:
    """Durable CRM-to-remote connector push runtime (see README.md)."""
    if debug:
        enable_debug()


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


def _register_all() -> None:
    # Each command module exposes `register(app)`; imported here so `--help` stays fast
    # to extend and no module does work at import time.
    from cli import (
        audit_cmd,
        backfill_cmd,
        dev_cmd,
        ingress_cmd,
        link_cmds,
        link_key,
        migrate_cmd,
        operator_cmds,
        pack_cmd,
        prune_cmd,
        push_cmd,
        records_cmd,
        revalidate_cmd,
        sandbox_cmd,
        status_cmd,
        worker_cmd,
    )

    for module in (
        dev_cmd,
        worker_cmd,
        migrate_cmd,
        pack_cmd,
        records_cmd,
        sandbox_cmd,
        ingress_cmd,
        link_key,
        link_cmds,
        push_cmd,
        operator_cmds,
        revalidate_cmd,
        backfill_cmd,
        audit_cmd,
        prune_cmd,
        status_cmd,
    ):
        module.register(app)
    _finish_commands(app)


_register_all()
