"""Typed view of `temporal-dev.yaml`, the single home of the local stack's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from cli.stack.paths import DEFAULT_PATH as DEFAULT_PATH
from cli.stack.paths import REPO_ROOT as REPO_ROOT

SearchAttributeType = Literal["Keyword", "Text", "Int", "Double", "Bool", "Datetime", "KeywordList"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TemporalDevConfig(_Strict):
    frontend_ip: str
    frontend_port: int
    ui_port: int
    namespace: str
    db_file: str
    sqlite_pragmas: dict[str, str]
    log_level: str
    search_attributes: dict[str, SearchAttributeType]
    # `--dynamic-config-value KEY=VALUE` flags (values as the server parses them).
    dynamic_config: dict[str, str] = {}

    @property
    def address(self) -> str:
        return f"{self.frontend_ip}:{self.frontend_port}"


class PostgresDevConfig(_Strict):
    data_dir: str
    host: str
    port: int
    database: str
    user: str

    def dsn(self, database: str | None = None) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database or self.database}"


class ServiceDevConfig(_Strict):
    host: str
    port: int
    persist_file: str | None = None


class DevConfig(_Strict):
    data_dir: str = ".dev-data"
    temporal: TemporalDevConfig
    postgres: PostgresDevConfig
    task_queue: str
    ingress: ServiceDevConfig
    sandbox: ServiceDevConfig
    # The worker's Prometheus endpoint (SDK metrics and the OPS status gauges); absent: off.
    worker_metrics: ServiceDevConfig | None = None

    @property
    def logs_dir(self) -> Path:
        return self.resolve(self.data_dir) / "logs"

    def resolve(self, relative: str) -> Path:
        """A path from the file, taken relative to the repository root."""
        path = Path(relative)
        return path if path.is_absolute() else REPO_ROOT / path


def load_dev_config(path: Path = DEFAULT_PATH) -> DevConfig:
    """Read and validate `temporal-dev.yaml`; errors name the offending key."""
    with path.open(encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    return DevConfig.model_validate(raw)
