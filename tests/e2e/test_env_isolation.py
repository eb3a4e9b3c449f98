"""Issue 13: `make test` ignores the dev exports left in the shell unless asked to use them."""

from __future__ import annotations

import os
import subprocess
import sys

from cli.stack.devconfig import REPO_ROOT

PROBE = "tests/e2e/env_probe.py"
EXPORTS = {"DATABASE_URL": "postgresql://x@127.0.0.1:1/stale", "TEMPORAL_ADDRESS": "127.0.0.1:1"}


def _run(command: list[str], extra: dict[str, str]) -> str:
    env = {**os.environ, **EXPORTS, **extra}
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_shell_exports_are_ignored_by_default() -> None:
    """A whole pytest session (its plugins and fixtures loaded) sees none of them."""
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", PROBE]
    output = _run(pytest_run, {"CONNECTOR_PUSH_TEST_USE_ENV": ""})
    assert "probe DATABASE_URL=None" in output and "probe TEMPORAL_ADDRESS=None" in output


def test_shell_exports_are_used_when_asked() -> None:
    """The switch is read where the exports are dropped, tests/conftest.py's import; that
    import alone is the probe here (a second pytest session is ~5 s of CPU)."""
    probe = (
        "import os, tests.conftest; "
        "print(f\"probe DATABASE_URL={os.environ.get('DATABASE_URL')!r}\")"
    )
    output = _run([sys.executable, "-c", probe], {"CONNECTOR_PUSH_TEST_USE_ENV": "1"})
    assert f"probe DATABASE_URL={EXPORTS['DATABASE_URL']!r}" in output
    ignored = _run([sys.executable, "-c", probe], {"CONNECTOR_PUSH_TEST_USE_ENV": ""})
    assert "probe DATABASE_URL=None" in ignored  # the same probe can see the difference
