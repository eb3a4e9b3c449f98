"""`make test` runs a 90-second seeded chaos campaign (issue 10 deliverable 8, SPEC §14, NF-4).

The campaign runs as its own process (`python -m bench.chaos`) on its own private stack,
so its SIGKILLs and restarts never touch the session's Postgres or Temporal; the
verdict is read from the JSON it writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEED = "10"
SECONDS = "90"
# Stack start, 90 s of faults, the settle phase (bounded by CHAOS_SETTLE_SECONDS) and checks.
TIMEOUT_S = 900


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_seeded_chaos_campaign_keeps_every_guarantee(tmp_path: Path) -> None:
    results = tmp_path / "chaos.json"
    env = {
        **os.environ,
        "CHAOS_SEED": SEED,
        "CHAOS_SECONDS": SECONDS,
        "CHAOS_SETTLE_SECONDS": "240",
        "CHAOS_RESULTS": str(results),
        "CHAOS_WORKDIR": str(tmp_path),  # logs of a failing run stay with pytest's tmp dirs
    }
    run = subprocess.run(
        [sys.executable, "-m", "bench.chaos"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S - 60,
        check=False,
    )
    assert results.exists(), f"campaign wrote no verdict:\n{run.stdout}\n{run.stderr[-4000:]}"
    verdict = json.loads(results.read_text())
    assert verdict["seed"] == int(SEED)
    assert verdict["faults_total"] > 0, run.stdout
    assert verdict["violations"] == [], run.stdout
    assert run.returncode == 0, run.stdout
