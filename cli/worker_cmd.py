"""`connector-push worker`: run the Temporal worker for the `connector-push` task queue."""

from __future__ import annotations

import typer
from rich.markup import escape

from cli.database import postgres_error
from cli.errors import EXIT_UNAVAILABLE, CliError, fail, load_settings


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker_command() -> None:
        """Run the worker (needs DATABASE_URL and TEMPORAL_ADDRESS; `make dev` sets both)."""
        import asyncio

        # Here, not at the top: the CLI starts without the worker's imports (a fast start).
        from cli.entry import temporal_error
        from worker.main import DependencyUnavailable, Misconfigured, run_worker
        from worker.runtime import MissingSearchAttributes
        from worker.settings import RuntimeSettings

        settings = load_settings(RuntimeSettings)
        try:
            asyncio.run(run_worker(settings))
        except Misconfigured as exc:  # before any connection: exit 5 naming the variable
            raise CliError(f"{exc}; fix the variable", EXIT_UNAVAILABLE) from None
        except DependencyUnavailable as exc:  # at start: exit 5 naming the setting
            if exc.dependency == "temporal":
                raise temporal_error(settings, exc.cause) from None
            raise postgres_error(settings.require_database_url(), exc.cause) from None
        except (MissingSearchAttributes, ValueError) as exc:
            fail(escape(str(exc)))
