"""Structured logging and OpenTelemetry tracing, wired once per composition root (NF-1)."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Final

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

from worker.settings import RuntimeSettings

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
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(settings: RuntimeSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = (
        JsonFormatter() if settings.log_json else RedactingFormatter("%(levelname)s %(message)s")
    )
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


def _exporter(settings: RuntimeSettings) -> SpanExporter | None:
    match settings.otel_exporter:
        case "none":
            return None
        case "console":
            return ConsoleSpanExporter()
        case "otlp":
            # Endpoint from CONNECTOR_PUSH_OTEL_ENDPOINT, else the standard OTEL_* variables.
            return OTLPSpanExporter(endpoint=settings.otel_endpoint)


def configure_tracing(settings: RuntimeSettings, service_name: str) -> TracerProvider:
    """Install a tracer provider; spans export only when an exporter is configured."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = _exporter(settings)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider
