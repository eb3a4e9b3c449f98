"""Endpoint policy loading (ING-2, ING-7): explicit ack-drop set in production, opt-in
legacy schemes, secrets from the environment and never in readback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from cli.stack.process import free_port
from ingress.config import ConfigError, load_config, parse_policy, readback
from protocol.ingress_policy import EndpointMode
from tests.ingress.support import ENVIRON, WEBHOOK_SECRET, policy_document


def _parse(**overrides: object) -> object:
    return parse_policy(yaml.safe_dump(policy_document(**overrides)))


def test_production_refuses_an_implicit_ack_drop_set() -> None:
    document = policy_document(profile="production")
    del document["ack_drop_endpoints"]
    with pytest.raises(ConfigError, match="ack_drop_endpoints"):
        parse_policy(yaml.safe_dump(document))


def test_production_accepts_an_explicit_empty_set_and_everything_retries() -> None:
    policy = parse_policy(
        yaml.safe_dump(
            policy_document("https://127.0.0.1:9", profile="production", ack_drop_endpoints=[])
        )
    )
    assert {policy.mode_of(e.name) for e in policy.endpoints} == {EndpointMode.RETRY}


def test_only_named_endpoints_drop() -> None:
    policy = parse_policy(yaml.safe_dump(policy_document()))
    assert policy.mode_of("crm-drop") is EndpointMode.ACK_DROP
    assert policy.mode_of("crm") is EndpointMode.RETRY


def test_ack_drop_cannot_name_a_workflow_action_endpoint() -> None:
    with pytest.raises(ConfigError, match="ack_drop_endpoints"):
        _parse(ack_drop_endpoints=["actions"])


@pytest.mark.parametrize("scheme", ["v1", "v2"])
def test_legacy_schemes_need_an_explicit_opt_in(scheme: str) -> None:
    document = policy_document()
    document["endpoints"][0]["signature"]["scheme"] = scheme
    with pytest.raises(ConfigError, match="allow_legacy_signature"):
        parse_policy(yaml.safe_dump(document))
    document["endpoints"][0]["signature"]["allow_legacy_signature"] = True
    parse_policy(yaml.safe_dump(document))


def test_a_secret_inline_in_the_file_is_not_a_field() -> None:
    document = policy_document()
    document["endpoints"][0]["signature"]["secret"] = "inline"
    with pytest.raises(ConfigError):
        parse_policy(yaml.safe_dump(document))


def test_missing_secret_variable_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_document()))
    with pytest.raises(ConfigError, match="TEST_ACTION_SECRET"):
        load_config(path, {"TEST_WEBHOOK_SECRET": "x"})
    config = load_config(path, ENVIRON)
    assert WEBHOOK_SECRET not in repr(config)


# A secret's bytes that are not UTF-8, and what os.environ makes of them (lone surrogates).
NOT_UTF8 = b"whsec-\xff\xfe-not-utf8"


def test_ing3_a_secret_that_is_not_utf8_refuses_to_start(tmp_path: Path) -> None:
    """ING-3 verifies signatures (and the save API compares bearer keys) over the secret's
    UTF-8 bytes: a value that has none is refused at start, naming the variable and not
    the value, instead of serving and answering every request 500."""
    path = tmp_path / "policy.yaml"
    save_api = {"clients": [{"name": "crm", "key_env": "TEST_SAVE_KEY", "owners": ["o"]}]}
    path.write_text(yaml.safe_dump(policy_document(save_api=save_api)))
    for variable in ("TEST_WEBHOOK_SECRET", "TEST_SAVE_KEY"):
        environ = {**ENVIRON, "TEST_SAVE_KEY": "save-key", variable: os.fsdecode(NOT_UTF8)}
        with pytest.raises(ConfigError, match=f"{variable} is not valid UTF-8") as raised:
            load_config(path, environ)
        assert "not-utf8" not in str(raised.value)
    env: dict[str, str | bytes] = {
        **os.environ,
        **ENVIRON,
        "TEST_SAVE_KEY": "save-key",
        "TEST_WEBHOOK_SECRET": NOT_UTF8,
        "DATABASE_URL": f"postgresql://127.0.0.1:{free_port()}/unused",
        "CONNECTOR_PUSH_INGRESS_PORT": str(free_port()),
        "CONNECTOR_PUSH_INGRESS_PROCESSES": "1",
    }
    # Without the check the process would serve (a run that never ends, cut by the timeout).
    started = subprocess.run(
        [sys.executable, "-m", "cli", "ingress", "--config", str(path)],
        env=env,  # POSIX passes a bytes value on as it is
        capture_output=True,
        timeout=60,
        check=False,
    )
    output = started.stdout + started.stderr
    assert started.returncode == 1, output
    assert b"TEST_WEBHOOK_SECRET is not valid UTF-8" in output
    assert b"not-utf8" not in output and b"Traceback" not in output


def test_unknown_handler_and_bad_expiration_are_rejected() -> None:
    document = policy_document()
    document["endpoints"][0]["routes"] = {"contact.deletion": "delete_everything"}
    with pytest.raises(ConfigError):
        parse_policy(yaml.safe_dump(document))
    document = policy_document()
    document["endpoints"][2]["actions"]["22"]["block_expiration"] = "7 days"
    with pytest.raises(ConfigError):
        parse_policy(yaml.safe_dump(document))


def test_readback_shows_modes_and_secret_presence_but_no_secret(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_document()))
    result = CliRunner().invoke(
        app, ["ingress", "readback", "--config", str(path), "--json"], env=ENVIRON
    )
    assert result.exit_code == 0, result.output
    assert WEBHOOK_SECRET not in result.output
    data = json.loads(result.output)
    assert data["ack_drop_endpoints"] == ["crm-drop"]
    modes = {e["name"]: (e["mode"], e["secret_present"]) for e in data["endpoints"]}
    assert modes == {
        "crm": ("retry", True),
        "crm-drop": ("ack_drop", True),
        "actions": ("retry", True),
    }
    assert readback(parse_policy(path.read_text()), {})["endpoints"][0]["secret_present"] is False


def test_example_policy_loads() -> None:
    policy = parse_policy(Path("examples/ingress.yaml").read_text())
    assert policy.ack_drop_endpoints == frozenset()


def test_a_deletion_route_must_say_how_to_scope_its_object_ids() -> None:
    document = policy_document()
    document["endpoints"][0]["routes"]["contact.deletion"] = {
        "handler": "remote_deletion",
        "target_object": "contacts",
    }
    with pytest.raises(ConfigError, match="scope_path and remote_scopes"):
        parse_policy(yaml.safe_dump(document))


# Secrets a hurried operator might paste into the policy file: as the variable's name,
# inline beside it, as a save-API client's key variable, and on a line YAML cannot read.
PASTED = ("whsec_pasted0secret", "inline0pasted0secret", "sk_live_pasted0key", "yaml0pasted0secret")


def _policy_with_pasted_secrets(tmp_path: Path) -> tuple[Path, Path]:
    document = policy_document()
    webhook, dropping = document["endpoints"][0], document["endpoints"][1]
    webhook["signature"] = {**webhook["signature"], "secret_env": PASTED[0]}
    dropping["signature"] = {**dropping["signature"], "secret": PASTED[1]}
    document["save_api"] = {"clients": [{"name": "crm", "key_env": PASTED[2], "owners": ["o"]}]}
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump(document))
    unreadable = tmp_path / "unreadable.yaml"
    unreadable.write_text(f"profile: development\nsecret_env: {PASTED[3]}: x\n")
    return invalid, unreadable


def test_nf1_a_secret_pasted_into_the_policy_is_not_echoed_at_start_or_by_readback(
    tmp_path: Path,
) -> None:
    """NF-1 (secrets never logged) and ING-2's readback: the error names each field,
    never the value found there, whether the policy is invalid or not YAML at all."""
    invalid, unreadable = _policy_with_pasted_secrets(tmp_path)
    for path, expected in ((invalid, "save_api.clients.0.key_env"), (unreadable, "line 2")):
        with pytest.raises(ConfigError, match=expected) as raised:
            parse_policy(path.read_text())
        env = {**ENVIRON, "DATABASE_URL": "postgresql://127.0.0.1:1/unused"}
        start = CliRunner().invoke(app, ["ingress", "--config", str(path)], env=env)
        readback_run = CliRunner().invoke(app, ["ingress", "readback", "--config", str(path)])
        # Both read the file as bad input (exit 2) before anything starts.
        assert (start.exit_code, readback_run.exit_code) == (2, 2), start.output
        for shown in (str(raised.value), start.output, readback_run.output):
            assert expected in " ".join(shown.split())
            unwrapped = "".join(shown.split())  # rich may fold a long value across lines
            assert not [secret for secret in PASTED if secret in unwrapped], shown
