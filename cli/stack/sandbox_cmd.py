"""`connector-push sandbox`: serve the sandbox remote (objects API, faults, ledger)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.database import bad_input, read_document

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from pydantic import ValidationError

    from sandbox.config import RateLimitConfig, SandboxConfig


def load_sandbox_config(
    config_file: Path | None, persist: Path | None, rate_limit: str | None = None
) -> SandboxConfig:
    """Read the YAML config (defaults without one); the flags override its fields.

    An unreadable file exits 2 (`read_document`); a config or flag that breaks its rule
    raises ValueError with one line naming the file or flag.
    """
    from pydantic import ValidationError

    from sandbox.config import SandboxConfig

    raw = read_document(config_file) if config_file is not None else None
    if raw is not None and not isinstance(raw, Mapping):
        raise ValueError(f"{config_file}: a sandbox config is a mapping of SandboxConfig fields")
    try:
        config = SandboxConfig.model_validate(raw or {})
    except ValidationError as error:
        raise ValueError(f"{config_file}: {_first_problem(error)}") from None
    if persist is not None:
        config = config.model_copy(update={"persist_path": persist})
    if rate_limit is not None:
        if config.mode != "generous":
            # model_copy does not validate: refuse what the mode would silently ignore.
            raise ValueError(
                f"--rate-limit sets the generous mode's token bucket; mode {config.mode} "
                f"takes its limits from {config.mode}_limits in the config"
            )
        config = config.model_copy(update={"rate_limit": parse_rate_limit(rate_limit)})
    return config


def _first_problem(error: ValidationError) -> str:
    first = error.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc']) or 'document'}: {first['msg']}"


def parse_rate_limit(text: str) -> RateLimitConfig:
    """`REQUESTS/SECONDS`, e.g. `100/10` for HubSpot's ten-second burst window."""
    from pydantic import ValidationError

    from sandbox.config import RateLimitConfig

    requests, slash, seconds = text.partition("/")
    wrong = f"--rate-limit {text!r}: expected REQUESTS/SECONDS, e.g. 100/10"
    if not slash:
        raise ValueError(wrong)
    try:
        return RateLimitConfig.model_validate({"requests": requests, "per_seconds": seconds})
    except ValidationError as error:
        raise ValueError(f"{wrong} ({_first_problem(error)})") from None


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
            Path | None, typer.Option(help="YAML SandboxConfig (mode, object types, seed).")
        ] = None,
        rate_limit: Annotated[
            str | None,
            typer.Option(help="Token bucket per object type, REQUESTS/SECONDS (e.g. 100/10)."),
        ] = None,
    ) -> None:
        """Serve the sandbox remote; see /_sandbox/ledger for the create ledger."""
        from cli.stack.devconfig import load_dev_config
        from sandbox.server import run_sandbox

        try:
            sandbox_config = load_sandbox_config(config, persist, rate_limit)
        except ValueError as exc:
            bad_input(str(exc))
        dev = load_dev_config().sandbox
        run_sandbox(sandbox_config, host or dev.host, port or dev.port)
