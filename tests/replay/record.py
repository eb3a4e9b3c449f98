"""Writing committed histories: on only with RECORD_HISTORIES=1 (re-record on purpose)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle

HISTORIES = Path(__file__).resolve().parent / "histories"


async def keep_history(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """Save `handle`'s history as tests/replay/histories/<name>.json when recording."""
    if os.environ.get("RECORD_HISTORIES") != "1":
        return
    history = await handle.fetch_history()
    (HISTORIES / f"{name}.json").write_text(history.to_json())
