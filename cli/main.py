"""The `connector-push` command: one typer app, commands registered per module."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.errors import EXIT_CODES_HELP, OneLineErrors, enable_debug

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
    return f"{epilog}\n\n{EXIT_CODES_HELP}" if epilog else EXIT_CODES_HELP


def _add_help_epilogs(typer_app: typer.Typer) -> None:
    """Every command's help lists the environment variables and exit codes."""
    for command in typer_app.registered_commands:
        command.epilog = _with_codes(command.epilog)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            group.epilog = _with_codes(group.epilog)
            _add_help_epilogs(group.typer_instance)


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
    _add_help_epilogs(app)


_register_all()
