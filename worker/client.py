"""Temporal client construction, shared by the worker, the CRM entry and the CLI."""

from __future__ import annotations

from temporalio.client import Client, TLSConfig
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from services.temporal_tls import temporal_tls
from worker.failures import DATA_CONVERTER
from worker.settings import RuntimeSettings


def tls_config(settings: RuntimeSettings) -> TLSConfig | bool:
    """The worker's and the CLI's Temporal TLS (`temporal_tls`)."""
    return temporal_tls(
        settings.temporal_tls_ca,
        settings.temporal_tls_cert,
        settings.temporal_tls_key,
        tls=settings.temporal_tls,
        api_key=settings.temporal_api_key is not None,
    )


def sdk_runtime(settings: RuntimeSettings) -> Runtime | None:
    """The Temporal SDK runtime exporting Prometheus metrics, when a bind address is set.

    One runtime per process: create it once in the composition root and share it.
    """
    if settings.metrics_bind_address is None:
        return None
    metrics = PrometheusConfig(bind_address=settings.metrics_bind_address)
    return Runtime(telemetry=TelemetryConfig(metrics=metrics))


async def connect_temporal(settings: RuntimeSettings, runtime: Runtime | None = None) -> Client:
    """A client with the pydantic converter (trace-free refusals) and the tracing
    interceptor (NF-1)."""
    api_key = settings.temporal_api_key
    return await Client.connect(
        settings.require_temporal_address(),
        namespace=settings.temporal_namespace,
        data_converter=DATA_CONVERTER,
        interceptors=[TracingInterceptor()],
        tls=tls_config(settings),
        api_key=api_key.get_secret_value() if api_key else None,
        runtime=runtime,
    )
