"""`connector-push worker`: run the Temporal worker for the `connector-push` task queue."""

from __future__ import annotations

import asyncio

import typer

from cli.errors import fail
from worker.main import run_worker
from worker.runtime import MissingSearchAttributes
from worker.settings import RuntimeSettings


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker_command() -> None:
        """Run the worker (needs DATABASE_URL and TEMPORAL_ADDRESS; `make dev` sets both)."""
        settings = RuntimeSettings()
        try:
            asyncio.run(run_worker(settings))
        except (MissingSearchAttributes, ValueError) as exc:
            fail(str(exc))
