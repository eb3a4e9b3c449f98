"""bench-scale's harness at a tiny N (issue 34 item 5), so `make bench-scale` cannot rot:
every part runs its real commands against the session's Postgres (a clone of the
migrated template per part), push and backfill apply are interrupted part-way by SIGINT
and resumed, and every figure the report names is there.

The commands are forked from the test process's CLI server (tests/cli_zygote.py) rather
than started cold: real processes with their own exit status and signals, without ~2 s
of imports each. A forked child's peak RSS says nothing (it shares the server's
imports), so the launcher reports none and no `*_rss_mb` key is expected here; `make
bench-scale` starts each command cold and reads it from `os.wait4`.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from bench.scale.context import Context
from bench.scale.harness import PARTS, run_scale, table
from bench.scale.runner import Launched
from tests import cli_process
from tests.fixtures.postgres import PgServer

N = 200


def forked(args: Sequence[str], env: Mapping[str, str], stdout: Path, stderr: Path) -> Launched:
    """`connector-push ARGS` forked by the fork server (its request protocol)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(cli_process._socket_path())
    request = {"args": list(args), "env": {k: v for k, v in env.items() if k != "COLUMNS"}}
    request |= {"cwd": str(cli_process.REPO_ROOT), "stdout": str(stdout), "stderr": str(stderr)}
    conn.sendall(json.dumps(request).encode() + b"\n")
    replies = conn.makefile("rb")
    pid = int(json.loads(replies.readline())["pid"])

    def wait() -> tuple[int, int | None]:
        try:
            return int(json.loads(replies.readline())["returncode"]), None
        finally:
            replies.close()
            conn.close()

    return Launched(pid, wait)


# ~14 commands and four small databases: 5 s on a quiet box, 20 s at a load of 8 here.
@pytest.mark.slow(seconds=15)
async def test_every_part_runs_and_reports(
    pg_server: PgServer, pg_template_db: str, tmp_path: Path
) -> None:
    context = Context(pg_server.admin_dsn, tmp_path, launcher=forked, template=pg_template_db)
    results = await run_scale(context, [N], PARTS, strict=True)
    figures = {
        "P4",
        "floor_per_s",
        "revalidate_plan_per_s",
        "revalidate_validate_per_s",
        "revalidate_apply_per_s",
        "push_per_s",
        "backfill_plan_per_s",
        "backfill_apply_per_s",
        "status_ms",
        "find_ms",
        "page_ms",
    }
    missing = sorted(f"{name}_{N}" for name in figures if f"{name}_{N}" not in results)
    assert not missing, (missing, results)
    assert f"revalidation_error_{N}" not in results, results[f"revalidation_error_{N}"]
    assert all(float(results[f"{name}_{N}"]) > 0 for name in figures), results
    assert results["pg_max_connections"] and results["pg_max_locks_per_transaction"]
    assert any(line.startswith("P4 ") for line in table(results, [N]).splitlines())
    assert not any(key.endswith("_rss_mb_200") for key in results)  # forked: not measured
    assert os.listdir(tmp_path)  # each part kept its commands' output
