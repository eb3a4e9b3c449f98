"""`connector-push ingress [--config FILE]` serves; `ingress readback` prints the policy."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from cli.database import bad_input, read_text_file
from cli.errors import EXIT_UNAVAILABLE, CliError, fail, load_settings

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from protocol.ingress_policy import IngressPolicy

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", help="Endpoint policy YAML (default: $CONNECTOR_PUSH_INGRESS_CONFIG)."
    ),
]


BreakGlassOption = Annotated[
    bool,
    typer.Option(
        "--break-glass-ack-drop",
        help=(
            "Incident only (ING-2'): let a production policy name ack_drop_endpoints, which"
            " answer 204 and drop events on internal failures; logged while it serves"
            " (also $CONNECTOR_PUSH_INGRESS_BREAK_GLASS_ACK_DROP=1)."
        ),
    ),
]


def _break_glass(flag: bool) -> bool:
    from ingress.config import PolicyLocation

    return flag or PolicyLocation().break_glass_ack_drop


def _policy_path(option: Path | None) -> Path:
    from ingress.config import PolicyLocation

    path = option or PolicyLocation().config
    if path is None:
        fail("no ingress policy: pass --config or set CONNECTOR_PUSH_INGRESS_CONFIG")
    return path


def _read_policy(path: Path, break_glass: bool) -> IngressPolicy:
    """The policy file parsed and validated; anything wrong with it exits 2, one line."""
    from ingress.config import ConfigError, parse_policy

    text = read_text_file(path, "the YAML policy")
    try:
        return parse_policy(text, break_glass_ack_drop=break_glass)
    except ConfigError as exc:
        bad_input(f"{path}: {' '.join(str(exc).split())}")
    except RecursionError:
        bad_input(f"{path}: nested too deeply to read")


def _print_readback(data: dict[str, object]) -> None:
    console = Console()
    console.print(f"profile: {data['profile']}", highlight=False)
    console.print(f"ack_drop_endpoints: {data['ack_drop_endpoints']}", highlight=False)
    if data["break_glass_ack_drop"]:
        console.print(
            f"BREAK-GLASS ack-drop in production: {data['break_glass_ack_drop']}", highlight=False
        )
    console.print(f"workflow_action_mode: {data['workflow_action_mode']}", highlight=False)
    console.print(
        f"head_timeout_ms: {data['head_timeout_ms']}  max_connections: {data['max_connections']}"
        f"  max_header_bytes: {data['max_header_bytes']}  max_headers: {data['max_headers']}",
        highlight=False,
    )
    if data["production_allows"]:
        console.print(f"production_allows: {data['production_allows']}", highlight=False)
    endpoints = data["endpoints"]
    assert isinstance(endpoints, list)
    for endpoint in endpoints:
        mode = endpoint.get("mode", "-")
        signature = endpoint["signature"]
        console.print(
            f"- {endpoint['name']} {endpoint['kind']} POST {endpoint['path']} mode={mode} "
            f"scheme={signature['scheme']} secret_env={signature['secret_env']} "
            f"secret_present={endpoint['secret_present']} deadline_ms={endpoint['deadline_ms']} "
            f"body_limit={endpoint['body_limit']}",
            highlight=False,
        )
        if "batch" in endpoint:
            console.print(f"  batch: {endpoint['batch']}", highlight=False)
    save_api = data["save_api"]
    if not isinstance(save_api, dict):
        console.print("save_api: not served", highlight=False)
        return
    console.print(
        f"save_api: POST /v1/saves, /v1/saves/batch max_batch={save_api['max_batch']} "
        f"body_limit={save_api['body_limit']} deadline_ms={save_api['deadline_ms']} "
        f"wake_timeout_ms={save_api['wake_timeout_ms']}",
        highlight=False,
    )
    for client in save_api["clients"]:
        console.print(
            f"- client {client['name']} key_env={client['key_env']} "
            f"key_present={client['key_present']}",
            highlight=False,
        )
        users = "any user" if client["users"] is None else ", ".join(client["users"])
        console.print(
            f"  saves for owners: {', '.join(client['owners'])}; users: {users}",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    ingress_app = typer.Typer(help="Webhook and workflow-action ingress (SPEC §11).")

    @ingress_app.callback(invoke_without_command=True)
    def ingress_command(
        ctx: typer.Context,
        config: ConfigOption = None,
        break_glass_ack_drop: BreakGlassOption = False,
    ) -> None:
        """Serve the ingress (needs DATABASE_URL and the secrets the policy names)."""
        ctx.obj = (config, break_glass_ack_drop)
        if ctx.invoked_subcommand is None:  # `readback` needs none of the server's imports
            from ingress.admission import DatabaseUrlUnreadable
            from ingress.config import ConfigError, IngressSettings, refuse_shared_save_api_keys
            from ingress.server import serve

            path = _policy_path(config)
            break_glass = _break_glass(break_glass_ack_drop)
            # a bad file is bad input (exit 2), as for `readback`
            policy = _read_policy(path, break_glass)
            try:
                refuse_shared_save_api_keys(policy, os.environ)
            except ConfigError as exc:
                bad_input(f"{path}: {exc}")
            settings = load_settings(IngressSettings)
            if break_glass:  # the flag on the command line: serve (and its processes) use it
                settings = settings.model_copy(update={"break_glass_ack_drop": True})
            try:
                serve(path, settings)
            except DatabaseUrlUnreadable as exc:
                raise CliError(str(exc), EXIT_UNAVAILABLE) from None
            except ConfigError as exc:
                fail(escape(str(exc)))

    @ingress_app.command("readback")
    def readback_command(
        ctx: typer.Context,
        config: ConfigOption = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Print the active endpoint policy (modes, schemes, limits); never secret values."""
        from ingress.config import ConfigError, readback

        given, break_glass_ack_drop = ctx.obj
        path = _policy_path(config or given)
        policy = _read_policy(path, _break_glass(break_glass_ack_drop))
        try:
            data = readback(policy, os.environ)
        except ConfigError as exc:
            bad_input(f"{path}: {' '.join(str(exc).split())}")
        if as_json:
            typer.echo(json.dumps(data, indent=2, sort_keys=True))
        else:
            _print_readback(data)

    app.add_typer(ingress_app, name="ingress")
