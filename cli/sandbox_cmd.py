"""`connector-push sandbox`: serve the sandbox remote (objects API, faults, ledger)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.markup import escape

from cli.errors import fail
from cli.stack.devconfig import load_dev_config
from sandbox.config import RateLimitConfig, SandboxConfig
from sandbox.server import run_sandbox


def load_sandbox_config(
    config_file: Path | None, persist: Path | None, rate_limit: str | None = None
) -> SandboxConfig:
    """Read the YAML config (defaults without one); the flags override its fields."""
    raw = yaml.safe_load(config_file.read_text("utf-8")) if config_file is not None else None
    config = SandboxConfig.model_validate(raw or {})
    if persist is not None:
        config = config.model_copy(update={"persist_path": persist})
    if rate_limit is not None:
        config = config.model_copy(update={"rate_limit": parse_rate_limit(rate_limit)})
    return config


def parse_rate_limit(text: str) -> RateLimitConfig:
    """`REQUESTS/SECONDS`, e.g. `100/10` for HubSpot's ten-second burst window."""
    requests, slash, seconds = text.partition("/")
    if not slash:
        raise ValueError(f"--rate-limit {text!r}: expected REQUESTS/SECONDS, e.g. 100/10")
    return RateLimitConfig.model_validate({"requests": requests, "per_seconds": seconds})


def register(app: typer.Typer) -> None:
    """Add the `sandbox` command."""

    @app.command("sandbox")
    def sandbox_command(
        port: Annotated[
            int | None, typer.Option(help="TCP port (default: sandbox.port in temporal-dev.yaml).")
        ] = None,
        host: Annotated[
            str | None,
            typer.Option(help="Interface to bind (default: sandbox.host in temporal-dev.yaml)."),
        ] = None,
        persist: Annotated[
            Path | None, typer.Option(help="JSON file keeping state across restarts.")
        ] = None,
        config: Annotated[
            Path | None, typer.Option(help="YAML SandboxConfig (object types, seed).")
        ] = None,
        rate_limit: Annotated[
            str | None,
            typer.Option(help="Token bucket per object type, REQUESTS/SECONDS (e.g. 100/10)."),
        ] = None,
    ) -> None:
        """Serve the sandbox remote; see /_sandbox/ledger for the create ledger."""
        try:
            sandbox_config = load_sandbox_config(config, persist, rate_limit)
        except (OSError, yaml.YAMLError, ValueError) as exc:
            fail(escape(f"sandbox config: {exc}"))
        dev = load_dev_config().sandbox
        run_sandbox(sandbox_config, host or dev.host, port or dev.port)
