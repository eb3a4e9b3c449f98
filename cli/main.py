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
    # Each command module exposes `register(app)`; add one line per module.
    from cli import worker_cmd

    worker_cmd.register(app)
    from cli import sandbox_cmd

    sandbox_cmd.register(app)
    from cli import migrate_cmd

    migrate_cmd.register(app)
    from cli import ingress_cmd

    ingress_cmd.register(app)
    from cli import link_key

    link_key.register(app)


_register_all()
