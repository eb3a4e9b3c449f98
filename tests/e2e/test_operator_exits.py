"""Operator commands as real processes (issue 13): each exits with its documented code,
every time. A process that leaves the Temporal runtime to interpreter shutdown can crash
after printing its answer (134, 139 were seen); 20 runs of each command, on its cheap
refusal path that still connects, wakes and asks the workflow, must all exit 1 with one
line. Temporal down is one line, exit 5."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from cli.stack.devconfig import REPO_ROOT, load_dev_config
from cli.stack.process import free_port, free_ports
from cli.stack.temporal import TemporalDevServer
from sandbox.faults import FaultRuleSpec
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.support import eventually
from worker.crm import workflow_id

# The issue asks for 20 runs of each command; 100 processes are ~4 min of CPU, so the
# suite (which CI runs on every landing) takes one of each — five processes through the
# one exit path they share (5, then 2, until issue 31's budget: these real processes were
# the suite's largest CPU item left) — and a release check takes 20:
# CONNECTOR_PUSH_EXIT_RUNS=20 pytest tests/e2e/test_operator_exits.py
RUNS = int(os.environ.get("CONNECTOR_PUSH_EXIT_RUNS", "1"))
CONCURRENT = 3  # a process is ~2 s of CPU (imports), mostly waiting on the server after
WHO = ["--operator", "ops@example.com", "--reason", "exit codes"]


async def run(env: dict[str, str], *args: str) -> tuple[int, str]:
    """One CLI process, off the event loop (asyncio's own subprocesses leave transports
    for the garbage collector, which pytest then reports after the loop closed)."""
    base = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "TEMPORAL_ADDRESS"}}
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cli", *args],
        cwd=REPO_ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def cli_env(stack: Stack, server: TemporalDevServer, dsn: str) -> dict[str, str]:
    return {
        "DATABASE_URL": dsn,
        "TEMPORAL_ADDRESS": server.address,
        "TEMPORAL_NAMESPACE": server.config.namespace,
        "CONNECTOR_PUSH_TASK_QUEUE": stack.task_queue,
    }


async def _finalized_and_failed(stack: Stack) -> tuple[str, str]:
    """A finalized contact (c-001) and one whose only attempt failed terminally (c-002)."""
    await stack.push("c-001")
    finalized = contact_key("c-001")
    await eventually(lambda: stack.attempt(finalized), lambda r: r["status"] == "finalized")
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/contacts", action="status", status=422)
    )
    await stack.push("c-002")
    failed = contact_key("c-002")
    await eventually(lambda: stack.attempt(failed), lambda r: r["status"] == "terminal_failed")
    return finalized, failed


# Each process is ~2.5 s of CPU (mostly imports); 20 runs of each took 578 s while four
# other test runs shared the machine: not the default 120 s.
@pytest.mark.slow(seconds=40)
@pytest.mark.timeout(1200)
async def test_each_operator_command_exits_with_its_documented_code_every_time(
    stack: Stack, temporal_server: TemporalDevServer, db_dsn: str
) -> None:
    finalized, failed = await _finalized_and_failed(stack)
    commands = {
        "supersede": ["supersede", finalized, *WHO],
        "reconcile": ["reconcile", finalized, "--remote-id", "1", "--evidence", "x", *WHO],
        "mark-terminal": ["mark-terminal", finalized, *WHO],
        "revalidate-link": ["revalidate-link", finalized, *WHO],
        "retire": ["retire", failed, *WHO],
    }
    env = cli_env(stack, temporal_server, db_dsn)
    slots = asyncio.Semaphore(CONCURRENT)

    async def once(args: list[str]) -> tuple[int, str]:
        async with slots:
            return await run(env, *args)

    jobs = [(name, once(args)) for name, args in commands.items() for _ in range(RUNS)]
    results = await asyncio.gather(*(job for _, job in jobs))
    for (name, _), (code, output) in zip(jobs, results, strict=True):
        assert code == 1, f"{name} exited {code}:\n{output}"
        [line] = output.strip().splitlines()
        assert "refused" in line and "does not apply" in line, line


async def test_temporal_down_is_one_line_exit_5(
    stack: Stack, temporal_server: TemporalDevServer, db_dsn: str
) -> None:
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    env = {
        **cli_env(stack, temporal_server, db_dsn),
        "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
    }
    code, output = await run(env, "retire", key, *WHO)
    assert code == 5, output
    assert "Traceback" not in output
    [line] = output.strip().splitlines()
    assert "cannot reach Temporal" in line and "$TEMPORAL_ADDRESS" in line, line


@pytest.mark.slow(seconds=15)
async def test_temporal_gone_mid_action_is_one_line_exit_5(
    stack: Stack, db_dsn: str, tmp_path: Path
) -> None:
    """Connected, then Temporal stops answering (chaos saw "RPCError: Timeout expired" and
    "transport error" as exit 1, "unexpected error"): exit 5, one line that says the
    action may have been applied and how to find out."""
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    frontend, ui = free_ports(2)
    config = load_dev_config().temporal.model_copy(
        update={"frontend_port": frontend, "ui_port": ui}
    )
    server = TemporalDevServer(
        config=config, db_file=tmp_path / "t.sqlite", log_path=tmp_path / "t.log", ui=False
    )
    server.start()
    try:
        await server.wait_ready()
        client = await Client.connect(server.address, namespace=config.namespace)
        # A task queue no worker polls: the wake starts the run, whose state query then
        # waits for a worker that never comes, until the server goes away.
        env = {
            "DATABASE_URL": db_dsn,
            "TEMPORAL_ADDRESS": server.address,
            "TEMPORAL_NAMESPACE": config.namespace,
            "CONNECTOR_PUSH_TASK_QUEUE": "nobody-polls-this",
        }
        action = asyncio.create_task(run(env, "retire", key, *WHO))
        handle = client.get_workflow_handle(workflow_id(key))

        async def started() -> bool:
            try:
                await handle.describe()
            except RPCError:
                return False
            return True

        await eventually(started, bool, timeout_s=60)
    finally:
        server.stop()
    code, output = await asyncio.wait_for(action, 120)
    assert code == 5, output
    assert "Traceback" not in output
    [line] = output.strip().splitlines()
    assert "Temporal did not finish retire" in line, line
    assert f"connector-push links show {key}" in line, line
