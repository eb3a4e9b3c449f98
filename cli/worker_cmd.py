"""`connector-push worker`: run the Temporal worker for the `connector-push` task queue."""

from __future__ import annotations

import asyncio

import typer
from pydantic import ValidationError
from rich.markup import escape

from cli.database import postgres_error
from cli.entry import temporal_error
from cli.errors import EXIT_UNAVAILABLE, CliError, fail
from worker.main import DependencyUnavailable, run_worker
from worker.runtime import MissingSearchAttributes
from worker.settings import RuntimeSettings


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker_command() -> None:
        """Run the worker (needs DATABASE_URL and TEMPORAL_ADDRESS; `make dev` sets both)."""
        settings = _settings()
        try:
            asyncio.run(run_worker(settings))
        except DependencyUnavailable as exc:  # at start: exit 5 naming the setting
            if exc.dependency == "temporal":
                raise temporal_error(settings, exc.cause) from None
            raise postgres_error(settings.require_database_url(), exc.cause) from None
        except (MissingSearchAttributes, ValueError) as exc:
            fail(escape(str(exc)))


def _settings() -> RuntimeSettings:
    """The environment's settings, or exit 5 naming the variable and its rule."""
    try:
        return RuntimeSettings()
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "environment"
        field = RuntimeSettings.model_fields.get(name)
        alias = field.validation_alias if field else None
        prefix = RuntimeSettings.model_config.get("env_prefix", "")
        variable = alias if isinstance(alias, str) else f"{prefix}{name}".upper()
        raise CliError(
            f"{variable}: {first['msg']}; fix the variable (values are not shown)",
            EXIT_UNAVAILABLE,
        ) from None
