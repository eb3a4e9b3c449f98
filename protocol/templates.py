"""Pack-owned path templates: placeholders are checked against a closed set."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote

_PLACEHOLDER: Final = re.compile(r"\{([^{}]*)\}")

CREATE_PLACEHOLDERS: Final = frozenset({"target"})
UPDATE_PLACEHOLDERS: Final = frozenset({"target", "remoteId"})
LOOKUP_PLACEHOLDERS: Final = frozenset({"target", "locator", "property"})


class TemplateError(ValueError):
    """A path template that is malformed, record-derived, or cannot render."""


def placeholders(template: str) -> tuple[str, ...]:
    """Placeholder names in order; raises `TemplateError` on a stray brace."""
    rest = _PLACEHOLDER.sub("", template)
    if "{" in rest or "}" in rest:
        raise TemplateError(f"unbalanced brace in {template!r}")
    return tuple(match.group(1) for match in _PLACEHOLDER.finditer(template))


def check_template(template: str, allowed: frozenset[str], required: frozenset[str]) -> None:
    """Raise `TemplateError` unless `template` is a relative path over `allowed` only."""
    if not template.startswith("/") or template.startswith("//"):
        raise TemplateError(f"{template!r} must be a relative path starting with '/'")
    names = placeholders(template)
    for name in names:
        if name.startswith("record") or "." in name or "[" in name:
            raise TemplateError(
                f"placeholder {{{name}}} is record-derived; templates may use only "
                f"pack-owned placeholders {sorted(allowed)}"
            )
        if name not in allowed:
            raise TemplateError(f"unknown placeholder {{{name}}}; allowed: {sorted(allowed)}")
    missing = required - set(names)
    if missing:
        raise TemplateError(f"{template!r} must contain {sorted('{' + m + '}' for m in missing)}")


def render(template: str, values: Mapping[str, str]) -> str:
    """Render with percent-encoded values; every placeholder needs a non-empty value."""
    check_template(template, frozenset(values), frozenset())

    def substitute(match: re.Match[str]) -> str:
        value = values[match.group(1)]
        if not value:
            raise TemplateError(f"empty value for {{{match.group(1)}}}")
        return quote(value, safe="")

    return _PLACEHOLDER.sub(substitute, template)
