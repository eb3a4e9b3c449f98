"""Structured logging and OpenTelemetry tracing, wired once per composition root (NF-1)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

from services.log_format import install
from worker.settings import RuntimeSettings


def configure_logging(settings: RuntimeSettings) -> None:
    install(json_lines=settings.log_json, level=settings.log_level)


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
