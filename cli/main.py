"""The `connector-push` command: one typer app, commands registered per module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="connector-push",
    help="Durable CRM-to-remote connector push runtime.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Durable CRM-to-remote connector push runtime (see README.md)."""


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


_register_all()
