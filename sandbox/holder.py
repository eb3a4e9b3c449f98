"""Owner of the sandbox state: loads it, persists it after each mutation, resets it."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from sandbox.config import SandboxConfig
from sandbox.state import SandboxState


def now_iso() -> str:
    """Current UTC time in HubSpot's timestamp format (milliseconds, `Z`)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class StateHolder:
    """The one mutable `SandboxState`; call `commit()` after every mutation."""

    def __init__(self, config: SandboxConfig) -> None:
        self._config = config
        self._path = config.persist_path
        self.state = self._load() or self._fresh()

    def commit(self) -> None:
        """Write the state to the persist file, if one is configured, atomically."""
        if self._path is not None:
            _write_atomically(self._path, self.state.model_dump_json())

    def reset(self) -> None:
        """Forget every object, ledger entry, idempotency record and callback."""
        self.state = self._fresh()
        self.commit()

    def _fresh(self) -> SandboxState:
        return SandboxState(next_id=self._config.first_id)

    def _load(self) -> SandboxState | None:
        if self._path is None or not self._path.exists():
            return None
        return SandboxState.model_validate(json.loads(self._path.read_text("utf-8")))


def _write_atomically(path: Path, text: str) -> None:
    # Write a sibling temp file, fsync it, then rename: a crash leaves the old or the new file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
