"""`connector-push push` (SPEC API-3): bulk initial sync, resumable, Ctrl-C safe."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys

import asyncpg
import pytest
from typer.testing import CliRunner, Result

from cli.main import app
from cli.stack.temporal import TemporalDevServer
from db.links import lock_link_key
from protocol.manifest import RateLimit
from protocol.rate_limit import paced_per_second
from services.record_loader import load_records, parse_records_document
from tests.e2e.conftest import OWNER, Stack, contact_key
from tests.e2e.support import eventually
from tests.e2e.test_relay import _relay

BULK = 120
CONTACTS = ["c-001", "c-002", "c-003"]  # c-004 has no Email: rejected every run


def _env(stack: Stack, temporal: TemporalDevServer, dsn: str) -> dict[str, str]:
    return {
        "DATABASE_URL": dsn,
        "TEMPORAL_ADDRESS": temporal.address,
        "CONNECTOR_PUSH_TASK_QUEUE": stack.task_queue,
    }


def _args(*extra: str) -> list[str]:
    return [
        "push",
        "--owner-key",
        OWNER,
        "--action-slot",
        "push-contact",
        "--user",
        "alice",
        *extra,
    ]


async def _invoke(env: dict[str, str], *args: str) -> tuple[int, str]:
    """The exit code and stdout (the summary; progress lines go to stderr)."""
    result = await _run(env, *args)
    return result.exit_code, result.stdout


async def _run(env: dict[str, str], *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


async def test_push_all_admits_each_record_once_and_a_second_run_admits_nothing(
    stack: Stack, temporal_server: TemporalDevServer, db_dsn: str
) -> None:
    stack.touched.update(contact_key(r) for r in CONTACTS)
    env = _env(stack, temporal_server, db_dsn)
    code, output = await _invoke(env, *_args("--all", "--json"))
    assert code == 3, output  # c-004 was rejected; the other three stand
    first = json.loads(output)
    assert first["admitted"] == 3 and first["finalized"] == 3 and first["parked"] == 0
    assert first["rejected_by_reason"] == {"required_field_missing": 1}

    code, output = await _invoke(env, *_args("--all"))
    assert code == 3, output  # c-004, rejected again
    assert "nothing to admit: 3 already linked" in output
    code, output = await _invoke(env, *_args("--all", "--json"))
    again = json.loads(output)
    assert again["admitted"] == 0 and again["skipped_already_linked"] == 3
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert len(creates) == 3


async def test_push_named_records_limit_and_bad_input(
    stack: Stack, temporal_server: TemporalDevServer, db_dsn: str
) -> None:
    env = _env(stack, temporal_server, db_dsn)
    stack.touched.update(contact_key(r) for r in CONTACTS)
    code, output = await _invoke(
        env, *_args("--record-id", "c-001", "--record-id", "zz-9", "--no-wait", "--json")
    )
    assert code == 3, output  # zz-9 was not found; c-001 stands
    named = json.loads(output)
    assert named["admitted"] == 1 and named["not_found"] == ["zz-9"]
    code, output = await _invoke(env, *_args("--all", "--limit", "1", "--no-wait", "--json"))
    limited = json.loads(output)
    # c-001 holds its slot (skipped, not counted), one more is admitted and then it stops.
    assert (
        limited["admitted"] == 1
        and limited["skipped_active_attempt"] + limited["skipped_already_linked"] == 1
    )
    assert (await _invoke(env, *_args()))[0] == 2  # neither --all nor --record-id
    result = await _run(
        env, "push", "--owner-key", OWNER, "--action-slot", "nope", "--user", "alice", "--all"
    )
    assert result.exit_code == 2 and "no active pack with action slot" in result.stderr


async def test_piped_push_writes_plain_progress_lines_to_stderr_and_json_to_stdout(
    stack: Stack, temporal_server: TemporalDevServer, db_dsn: str
) -> None:
    """Issue 33 item 5: not on a terminal (a job, a pipe), progress is a plain line on
    stderr every --progress-every seconds, with the time left at the budget's pace (the
    demo pack's 100 requests per 10 s, at the rate its slots are paced, PROF-3); stdout
    is only the summary."""
    pace = paced_per_second(RateLimit(requests=100, per_seconds=10))
    stack.touched.update(contact_key(r) for r in ["c-001", "c-004"])
    env = _env(stack, temporal_server, db_dsn)
    result = await _run(
        env,
        *_args("--record-id", "c-001", "--record-id", "c-004", "--json"),
        "--progress-every",
        "0.1",
    )
    assert result.exit_code == 3, result.output  # c-004 is rejected; c-001 stands
    summary = json.loads(result.stdout)  # exactly one JSON document
    assert summary["admitted"] == 1 and summary["finalized"] == 1
    lines = result.stderr.splitlines()
    progress = [line for line in lines if line.startswith("push: ")]
    assert progress, result.stderr
    assert re.fullmatch(
        r"push: admitted [01], finalized [01], parked 0, rejected [01], "
        r"skipped 0 linked \+ 0 active; [\d.]+ admitted/s, [\d.]+ finalized/s; "
        r"[0-2] saves left, time left ~\d+s at the budget's pace "
        + re.escape(f"({pace:.1f} requests/s)"),
        progress[0],
    ), progress[0]
    assert "\x1b" not in result.stderr and "push: " not in result.stdout


async def _bulk_contacts(pool: asyncpg.Pool) -> list[str]:
    ids = [f"cb-{i:04}" for i in range(BULK)]
    doc = parse_records_document(
        {
            "records": [
                {"object": "Contact", "id": r, "fields": {"FirstName": "B", "Email": f"{r}@x.test"}}
                for r in ids
            ],
            "grants": [
                {
                    "user": "alice",
                    "object": "Contact",
                    "records": "*",
                    "fields": [
                        "FirstName",
                        "LastName",
                        "Email",
                        "Phone",
                        "remote_id__c",
                        "remote_provenance__c",
                    ],
                }
            ],
        }
    )
    async with pool.acquire() as conn:
        await load_records(conn, doc)
    return ids


async def _attempts(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM connector_push_attempt"))


async def _lock_waits(pool: asyncpg.Pool) -> int:
    """Advisory locks some session of this database waits for."""
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    )


@pytest.mark.slow(seconds=40)
async def test_sigint_mid_run_leaves_every_admitted_save_standing(
    stack: Stack, temporal_server: TemporalDevServer, db_dsn: str
) -> None:
    ids = await _bulk_contacts(stack.pool)
    stack.touched.update(contact_key(r) for r in [*ids, *CONTACTS])
    env = {**os.environ, **_env(stack, temporal_server, db_dsn)}
    # The run is held mid-way: this test holds the link-key lock a page admission takes
    # for one record halfway through, so Ctrl-C reaches the run while it still admits
    # (a run left to itself can finish before a loaded host delivers the signal).
    blocker = await asyncpg.connect(db_dsn)
    held = blocker.transaction()
    await held.start()
    await lock_link_key(blocker, contact_key(ids[BULK // 2]))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            *_args("--all", "--concurrency", "1", "--page-size", "10", "--no-wait", "--json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await eventually(lambda: _attempts(stack.pool), lambda n: n >= 10, timeout_s=60)
        await eventually(lambda: _lock_waits(stack.pool), lambda n: n >= 1, timeout_s=60)
        process.send_signal(signal.SIGINT)
        stdout, stderr = await asyncio.to_thread(process.communicate, timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            await asyncio.to_thread(process.communicate)  # reaped: nothing left to a later test
        await held.rollback()
        await blocker.close()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True
    admitted = await _attempts(stack.pool)
    assert 10 <= admitted < BULK + 3
    assert summary["admitted"] <= admitted  # one may commit as the signal lands

    await _relay(stack)  # a wake-up the signal cut short is the relay's to do
    await eventually(
        lambda: stack.pool.fetchval(
            "SELECT count(*) FROM connector_push_attempt WHERE status <> 'finalized'"
        ),
        lambda n: n == 0,
        timeout_s=90,
    )
    code, output = await _invoke(_env(stack, temporal_server, db_dsn), *_args("--all", "--json"))
    rest = json.loads(output)
    assert code == 3, output  # c-004, rejected every run
    assert rest["skipped_already_linked"] == admitted
    assert rest["admitted"] == BULK + 3 - admitted and rest["finalized"] == rest["admitted"]
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert len(creates) == BULK + 3 == len({c.object_id for c in creates})
