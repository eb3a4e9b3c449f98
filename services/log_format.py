"""Log lines for every process: one JSON object a line, credentials masked (NF-1, S-6).

The worker and the ingress write the same lines through `install`: a message is
JSON-escaped, so a value it carries (a decoded request path holding `%0A`) cannot start
a line of its own, and `redact` masks what a message or a traceback may carry.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Final

# Context keys copied from a log record's `extra` into the JSON line.
CONTEXT_KEYS: Final = ("link_key", "attempt_id", "workflow_id", "patch_id", "event_id")

# Credentials inside URLs and common secret-bearing assignments are masked in any line.
_SECRET_PATTERNS: Final = (
    re.compile(r"(?P<keep>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE),
    re.compile(r"(?P<keep>[a-z][a-z0-9+.-]*://[^:/@\s]+:)[^@\s]+(?=@)", re.IGNORECASE),
    re.compile(
        r"(?P<keep>(?:password|secret|token|api[_-]?key|authorization)[\"']?\s*[:=]\s*[\"']?)"
        r"[^\s\"',]+",
        re.IGNORECASE,
    ),
)


def redact(text: str) -> str:
    """Mask credentials that a message may carry (DSN passwords, key=value secrets)."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group("keep") + "***", text)
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the correlation ids a record carries."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


class RedactingFormatter(logging.Formatter):
    """Plain text (`CONNECTOR_PUSH_LOG_JSON=0`): the message's line breaks are escaped, so
    a value it carries cannot start a line; a traceback keeps its own."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        one_line = logging.makeLogRecord({**record.__dict__, "msg": message, "args": None})
        return redact(super().format(one_line))


def install(*, json_lines: bool, level: str) -> None:
    """Route every logger (uvicorn's too, which then adds no handler of its own) to one
    stderr handler with the redacting formatter."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = (
        JsonFormatter() if json_lines else RedactingFormatter("%(levelname)s %(message)s")
    )
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
