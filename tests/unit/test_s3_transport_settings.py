"""SPEC S-3: the settings that decide how the worker and the CLI reach Temporal (a private
CA, `TEMPORAL_TLS_CA`) and whether a production worker may send over plain http."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from temporalio.client import TLSConfig

from services.plain_http import PlainHttpRefused, refuse_plain_http
from worker.client import tls_config
from worker.main import Misconfigured, _say_plain_http_allowed, check_configuration
from worker.settings import RuntimeSettings

CA = b"-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"


def _settings(**values: object) -> RuntimeSettings:
    base: dict[str, object] = {"database_url": "postgresql://u@h/d", "temporal_address": "h:7233"}
    return RuntimeSettings.model_validate(base | values)


@pytest.fixture
def ca_file(tmp_path: Path) -> str:
    path = tmp_path / "temporal-ca.pem"
    path.write_bytes(CA)
    return str(path)


def test_s3_temporal_tls_ca_is_the_servers_root_and_implies_tls(
    ca_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPORAL_TLS_CA", ca_file)
    tls = tls_config(RuntimeSettings())
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == CA
    assert tls.client_cert is None and tls.client_private_key is None


def test_s3_temporal_tls_ca_with_a_client_certificate(ca_file: str, tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_bytes(b"cert")
    (tmp_path / "k.pem").write_bytes(b"key")
    tls = tls_config(
        _settings(
            temporal_tls_ca=ca_file,
            temporal_tls_cert=str(tmp_path / "c.pem"),
            temporal_tls_key=str(tmp_path / "k.pem"),
        )
    )
    assert isinstance(tls, TLSConfig)
    assert (tls.server_root_ca_cert, tls.client_cert, tls.client_private_key) == (
        CA,
        b"cert",
        b"key",
    )


def test_without_a_ca_tls_is_the_system_roots_or_off() -> None:
    assert tls_config(_settings(temporal_tls=True)) is True
    assert tls_config(_settings()) is False


def test_s3_an_unreadable_temporal_tls_ca_refuses_the_worker_naming_the_variable() -> None:
    with pytest.raises(Misconfigured) as refused:
        check_configuration(_settings(temporal_tls_ca="/no/such/ca.pem"))
    assert refused.value.variable == "TEMPORAL_TLS_CA" and "/no/such" not in str(refused.value)


def test_s3_a_readable_temporal_tls_ca_passes_the_start_checks(ca_file: str) -> None:
    check_configuration(_settings(temporal_tls_ca=ca_file))


@pytest.mark.parametrize(
    ("profile", "allow", "refused"),
    [
        ("development", None, False),
        ("production", None, True),
        ("production", "0", True),
        ("production", "1", False),
    ],
)
def test_s3_only_a_production_worker_without_the_named_exception_refuses_plain_http(
    monkeypatch: pytest.MonkeyPatch, profile: str, allow: str | None, refused: bool
) -> None:
    monkeypatch.setenv("CONNECTOR_PUSH_DEPLOYMENT_PROFILE", profile)
    if allow is None:
        monkeypatch.delenv("CONNECTOR_PUSH_ALLOW_PLAIN_HTTP", raising=False)
    else:
        monkeypatch.setenv("CONNECTOR_PUSH_ALLOW_PLAIN_HTTP", allow)
    assert RuntimeSettings().refuses_plain_http() is refused


def test_s3_an_unreadable_allow_setting_is_refused_not_read_as_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONNECTOR_PUSH_ALLOW_PLAIN_HTTP", "perhaps")
    with pytest.raises(ValueError, match="allow_plain_http"):
        RuntimeSettings()


async def test_s3_the_hook_refuses_http_naming_the_origin_never_user_information() -> None:
    await refuse_plain_http(httpx.Request("POST", "https://api.example.com/x"))
    with pytest.raises(PlainHttpRefused) as refused:
        await refuse_plain_http(httpx.Request("POST", "http://user:s3cret@api.example.com:8080/x"))
    assert "http://api.example.com:8080 is not https" in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_s3_a_production_worker_allowed_plain_http_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="worker.main"):
        _say_plain_http_allowed(_settings(deployment_profile="development", allow_plain_http=True))
        assert caplog.text == ""
        _say_plain_http_allowed(_settings(deployment_profile="production", allow_plain_http=True))
    assert "production profile allows plain http (CONNECTOR_PUSH_ALLOW_PLAIN_HTTP)" in caplog.text
