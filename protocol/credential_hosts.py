"""Where a credential may be sent (SPEC S-3): the hosts bound to it, declared beside it.

Rules kept in this module:
1. A credential is bound to hosts where it is configured, never in the pack: the
   variable `CONNECTOR_PUSH_CREDENTIAL_HOSTS_<REF>` (`hosts_variable`) beside the secret
   `CONNECTOR_PUSH_CREDENTIAL_<REF>` (`secret_variable`). Its name cannot be the secret
   variable of any reference: every reference's secret variable starts with its scheme
   (`..._CREDENTIAL_ENV_...`), and `hosts` is no scheme.
2. A binding is a comma-separated list of `host` or `host:port` (an IPv6 literal in
   brackets); a host without a port admits only its URL scheme's default port. No
   wildcards: each host a credential may reach is written out.
3. Fail closed: a credential with no binding, an unreadable binding, or a URL whose host
   is not in it is not sent. A refusal names the reference, the host and the variable
   to set, never the secret.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

VARIABLE_PREFIX: Final = "CONNECTOR_PUSH_CREDENTIAL_"
HOSTS_PREFIX: Final = VARIABLE_PREFIX + "HOSTS_"
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def _suffix(credential_ref: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", credential_ref.upper())


def secret_variable(credential_ref: str) -> str:
    """The variable holding the reference's secret (`env:SANDBOX_TOKEN` ->
    `CONNECTOR_PUSH_CREDENTIAL_ENV_SANDBOX_TOKEN`)."""
    return VARIABLE_PREFIX + _suffix(credential_ref)


def hosts_variable(credential_ref: str) -> str:
    """The variable holding the hosts the reference's secret may be sent to."""
    return HOSTS_PREFIX + _suffix(credential_ref)


@dataclass(frozen=True)
class HostPort:
    host: str  # lowercase; an IPv6 literal without brackets
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class BindingInvalid(ValueError):
    """A binding that cannot be read; the message says what is wrong with which entry."""


# `host` or `host:port`: a DNS name or IPv4 address, or an IPv6 literal in brackets.
_ENTRY: Final = re.compile(
    r"(?:(?P<name>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)|\[(?P<ipv6>[0-9A-Fa-f:.]+)\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
)


def _host_port(entry: str, scheme: str) -> HostPort | None:
    match = _ENTRY.fullmatch(entry)
    if match is None:
        return None
    port = int(match["port"]) if match["port"] else _DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        return None
    return HostPort((match["name"] or match["ipv6"]).lower(), port)


def parse_binding(text: str, scheme: str) -> frozenset[HostPort]:
    """The bound hosts for a URL of `scheme` (`http`/`https`); an entry without a port
    takes the scheme's default. Raises `BindingInvalid` naming the entry's position (an
    entry is a host, never a secret, but a token pasted here is not echoed either)."""
    entries = [entry.strip() for entry in text.split(",")]
    bound = set()
    for position, entry in enumerate(entries, start=1):
        found = _host_port(entry, scheme) if entry else None
        if found is None:
            raise BindingInvalid(f"entry {position} is not host or host:port")
        bound.add(found)
    return frozenset(bound)


def target_of(scheme: str, host: str, port: int | None) -> HostPort | None:
    """Where a request goes, from the URL as the HTTP client parsed it (so no second
    parser can disagree about the host); None when the scheme is not http(s)."""
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return HostPort(host.lower(), port if port is not None else _DEFAULT_PORTS[scheme])


def refusal(
    credential_ref: str, scheme: str, target: HostPort | None, binding: str | None
) -> str | None:
    """Why the reference's secret may not be sent to `target` over `scheme` (None: it
    may). `binding` is the value of `hosts_variable(credential_ref)`, None when unset."""
    variable = hosts_variable(credential_ref)
    if target is None:
        return f"credential {credential_ref} not sent: the URL is not http(s)"
    if not binding or not binding.strip():
        return (
            f"credential {credential_ref} is bound to no host ({variable} is unset); "
            f"not sent to {target}"
        )
    try:
        bound = parse_binding(binding, scheme)
    except BindingInvalid as invalid:
        return f"credential {credential_ref}: {variable} is unreadable ({invalid}); not sent"
    if target not in bound:
        return f"credential {credential_ref} is not bound to host {target} ({variable}); not sent"
    return None
