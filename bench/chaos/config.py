"""Campaign settings from the environment: `CHAOS_SEED`, `CHAOS_SECONDS`, `CHAOS_SETTLE_SECONDS`,
`CHAOS_SIDE_PATHS` (0: the main path's actors only, as before issue 50's side paths)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "chaos-latest.json"


@dataclass(frozen=True)
class ChaosConfig:
    """One campaign: its seed, how long faults are injected, how long settling may take."""

    seed: int = 1
    seconds: float = 600.0
    settle_seconds: float = 300.0
    workers: int = 2
    results: Path = RESULTS
    workdir: Path | None = None  # where the stack's data and logs go (default: the temp dir)
    side_paths: bool = True  # issue 50's side-path actors (pack apply, two-slot saves, ...)

    @classmethod
    def from_env(cls) -> ChaosConfig:
        seconds = float(os.environ.get("CHAOS_SECONDS", "600"))
        default_settle = str(max(150.0, min(300.0, seconds / 2)))
        return cls(
            seed=int(os.environ.get("CHAOS_SEED", "1")),
            seconds=seconds,
            settle_seconds=float(os.environ.get("CHAOS_SETTLE_SECONDS", default_settle)),
            results=Path(os.environ.get("CHAOS_RESULTS", str(RESULTS))),
            workdir=Path(os.environ["CHAOS_WORKDIR"]) if "CHAOS_WORKDIR" in os.environ else None,
            side_paths=os.environ.get("CHAOS_SIDE_PATHS", "1") != "0",
        )

    @property
    def record_pool(self) -> int:
        """Records per profile: enough fresh creates for the whole run."""
        return int(max(60, self.seconds / 3))
