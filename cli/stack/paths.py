"""Where the repository and its `temporal-dev.yaml` are: stdlib only, so `connector-push
dev` shows the default in its help without loading the config's pydantic models (a fast start)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATH = REPO_ROOT / "temporal-dev.yaml"
