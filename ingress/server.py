"""Serve the ingress with uvicorn: the one place a process reads its settings."""

from __future__ import annotations

import logging
from pathlib import Path

import uvicorn

from ingress.app import create_app
from ingress.config import ConfigError, IngressSettings, load_config


def serve(config_path: Path | None = None) -> None:
    """Load settings and policy once, then serve until interrupted."""
    settings = IngressSettings()
    path = config_path or settings.config
    if path is None:
        raise ConfigError("no ingress policy: pass --config or set CONNECTOR_PUSH_INGRESS_CONFIG")
    config = load_config(path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(
        config, settings.database_url.get_secret_value(), temporal=settings.temporal_target()
    )
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=False)
