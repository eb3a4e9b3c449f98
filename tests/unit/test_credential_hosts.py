"""SPEC S-3: the pure rule of where a credential may be sent (`protocol.credential_hosts`)."""

from __future__ import annotations

import pytest

from protocol.credential_hosts import (
    BindingInvalid,
    HostPort,
    hosts_variable,
    parse_binding,
    refusal,
    secret_variable,
    target_of,
)

REF = "env:HUBSPOT_TOKEN"
API = HostPort("api.hubapi.com", 443)


def test_s3_the_binding_sits_beside_the_secret_and_no_reference_can_name_it() -> None:
    assert secret_variable(REF) == "CONNECTOR_PUSH_CREDENTIAL_ENV_HUBSPOT_TOKEN"
    assert hosts_variable(REF) == "CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_HUBSPOT_TOKEN"
    # A reference whose name ends like a binding still has its own secret variable.
    assert secret_variable("env:HUBSPOT_TOKEN_HOSTS") != hosts_variable(REF)


def test_s3_a_host_without_a_port_admits_only_the_schemes_default_port() -> None:
    bound = parse_binding("api.hubapi.com, 127.0.0.1:8765 ,[::1]:9000", "https")
    assert bound == {API, HostPort("127.0.0.1", 8765), HostPort("::1", 9000)}
    assert parse_binding("API.HubAPI.com", "http") == {HostPort("api.hubapi.com", 80)}


@pytest.mark.parametrize(
    "binding", ["", "api.hubapi.com,", "*.hubapi.com", "https://api.hubapi.com", "u@h", "h:x"]
)
def test_s3_an_unreadable_binding_is_refused_naming_the_entry_not_its_value(binding: str) -> None:
    with pytest.raises(BindingInvalid) as info:
        parse_binding(binding, "https")
    assert "entry" in str(info.value)
    if binding:
        assert binding.split(",")[0] not in str(info.value)


@pytest.mark.parametrize(
    ("target", "binding", "refused_because"),
    [
        (API, None, "bound to no host (CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_HUBSPOT_TOKEN"),
        (API, "  ", "bound to no host"),
        (HostPort("evil.example", 443), "api.hubapi.com", "not bound to host evil.example:443"),
        (
            HostPort("api.hubapi.com", 8443),
            "api.hubapi.com",
            "not bound to host api.hubapi.com:8443",
        ),
        (API, "api.hubapi.com:", "unreadable (entry 1"),
        (None, "api.hubapi.com", "not http(s)"),
    ],
)
def test_s3_fail_closed_naming_the_reference_and_host(
    target: HostPort | None, binding: str | None, refused_because: str
) -> None:
    reason = refusal(REF, "https", target, binding)
    assert reason is not None
    assert REF in reason and refused_because in reason


def test_s3_a_bound_host_may_be_sent_to() -> None:
    assert refusal(REF, "https", API, "api.hubapi.com") is None
    assert (
        refusal(REF, "https", target_of("https", "API.hubapi.com", None), "api.hubapi.com") is None
    )
    assert target_of("ftp", "api.hubapi.com", None) is None
