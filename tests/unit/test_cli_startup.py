"""The CLI starts light (issue 31 item 3): `import cli.main` builds the whole command tree
from typer, rich and a few stdlib-only modules, and each command imports its services,
database, Temporal and HTTP layers in its body. Every `connector-push` process (an
operator's `--help`, the hundreds a test run spawns) used to pay ~3 s of CPU importing
all of them.

A fresh interpreter, because this test process has long imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What only a command's body may import. pydantic alone is a quarter of a second (our
# models are defined at import); yaml is read only with a config or input file; asyncio
# (~40 ms: ssl, socket, logging) only by a command that runs a loop.
HEAVY = (
    "asyncio",
    "temporalio",
    "asyncpg",
    "httpx",
    "opentelemetry",
    "uvicorn",
    "starlette",
    "pydantic",
    "pydantic_settings",
    "yaml",
    "services",
    "db",
    "sandbox",
    "ingress",
    "worker",
    "workflows",
    "activities",
    "bench",
)

PROBE = """
import json, sys
import cli.main
from typer.main import get_command
commands = sorted(get_command(cli.main.app).commands)
print(json.dumps({"modules": sorted(sys.modules), "commands": commands}))
"""


def test_the_command_tree_loads_without_the_layers_behind_it() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    # The tree is really there (a module failing to register would also import nothing).
    assert {"links", "push", "dev", "revalidate", "worker", "audit"} <= set(found["commands"])
    loaded = sorted(m for m in found["modules"] if m.split(".")[0] in HEAVY)
    assert loaded == [], f"imported at CLI start: {loaded[:20]}"


GC_PROBE = """
import gc, json, sys
from cli.main import app
app(["link-key", "--owner-key", "o", "--action-slot", "a", "--source-object", "Contact",
     "--record-id", "r", "--destination-slot", "d"], standalone_mode=False)
print(json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_every_command_runs_under_the_gc_policy() -> None:
    """worker.gc_policy: a command runs with the young generation's raised threshold and
    what was imported before it frozen (push --all spent ~20% of its CPU collecting)."""
    from worker.gc_policy import YOUNG_THRESHOLD

    probe = subprocess.run(
        [sys.executable, "-c", GC_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.splitlines()[-1])
    assert found["threshold"][0] == YOUNG_THRESHOLD
    assert found["frozen"] > 10_000
