"""Remote rate limits across workers (SPEC PROF-3), measured where they matter: at the remote.

Each test applies the demo pack with a `rateLimit` on one profile. The demo's
three profiles share one credential on one remote scope, so they spend one
budget. The sandbox is limited *above* the profile, so a 429 would mean the
pacing failed, and its log of admitted requests gives the rolling windows.

Tolerance: Temporal's fairness limiter lets a key run a few tasks over its pace
at the start (measured, one partition); the runtime paces each budget at its
window less that burst (protocol.rate_limit.paced_per_second), so every window
is asserted within the declared limit itself plus `WINDOW_TOLERANCE` (5%).
Measured here with the earlier fixed 85% pacing: two worker processes, limit
40/10 s, 90 creates: 3.58/s, busiest window 39-40.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import yaml
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from cli.stack.temporal import TemporalDevServer
from protocol.admission import SaveRequest
from protocol.identity import link_key
from sandbox.client import SandboxClient
from sandbox.config import RateLimitConfig, SandboxConfig
from sandbox.rate_limit import AppliedRequest, RateLimitSettings
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from services.rate_limit import ensure_fairness_limit
from services.record_loader import load_records, parse_records_document
from tests.e2e.support import eventually
from worker.crm import report_save, workflow_id
from worker.runtime import PASSTHROUGH_MODULES, build_worker, remote_http_client
from workflows.link import LinkWorkflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OWNER = "demo-owner"
WINDOW_S = 10.0
WINDOW_TOLERANCE = 0.05  # of the limit: window edges and the limiter's start-up burst


@pytest.fixture
def remote() -> Iterator[BackgroundSandbox]:
    config = SandboxConfig.model_validate(yaml.safe_load((EXAMPLES / "sandbox.yaml").read_text()))
    with BackgroundSandbox(config) as server:
        yield server


@pytest.fixture
async def sandbox(remote: BackgroundSandbox) -> AsyncIterator[SandboxClient]:
    async with httpx.AsyncClient(base_url=remote.url, timeout=10.0) as http:
        yield SandboxClient(remote.url, http)


def limited_manifest(base_url: str, requests: int) -> dict[str, object]:
    manifest: dict[str, object] = yaml.safe_load((EXAMPLES / "demo-pack.yaml").read_text())
    for profile in manifest["profiles"]:  # type: ignore[attr-defined]
        profile["baseUrl"] = base_url
        profile.pop("rateLimit", None)
    manifest["profiles"][0]["rateLimit"] = {"requests": requests, "perSeconds": WINDOW_S}  # type: ignore[index]
    return manifest


async def seed(
    pool: asyncpg.Pool, manifest: dict[str, object], contacts: int, prefix: str
) -> list[str]:
    """Apply the pack and load `contacts` pushable Contact records; returns their ids.

    Workflow ids follow link keys, shared by every test: `prefix` keeps this test's own.
    """
    ids = [f"{prefix}-{i:04d}" for i in range(contacts)]
    doc = yaml.safe_load((EXAMPLES / "demo-records.yaml").read_text())
    doc["records"] += [
        {"object": "Contact", "id": rid, "fields": {"Email": f"{rid}@example.com"}} for rid in ids
    ]
    async with pool.acquire() as conn:
        await apply_pack(conn, manifest)
        await load_records(conn, parse_records_document(doc))
    return ids


async def push_all(pool: asyncpg.Pool, client: Client, task_queue: str, ids: list[str]) -> None:
    saves = [
        SaveRequest(
            connector_owner_key=OWNER,
            action_slot_id="push-contact",
            destination_slot_id="remote-contacts",
            source_object="Contact",
            source_record_id=rid,
            originating_user_id="alice",
        )
        for rid in ids
    ]
    await asyncio.gather(*(report_save(pool, client, task_queue, s) for s in saves))


async def wait_for_creates(sandbox: SandboxClient, count: int, timeout_s: float) -> None:
    await eventually(
        lambda: sandbox.ledger("contacts", "create"),
        lambda creates: len(creates) >= count,
        timeout_s=timeout_s,
        interval_s=0.2,
    )


def busiest_window(applied: list[AppliedRequest]) -> int:
    """The most admitted requests in any rolling window of WINDOW_S seconds."""
    times = sorted(r.at for r in applied)
    start, best = 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - WINDOW_S:
            start += 1
        best = max(best, end - start + 1)
    return best


async def limit_sandbox(sandbox: SandboxClient, requests: int) -> None:
    # Above the profile's limit: a paced client never empties this bucket.
    await sandbox.reset()
    bucket = RateLimitConfig(requests=requests, per_seconds=WINDOW_S)
    await sandbox.set_rate_limit(RateLimitSettings(rate_limit=bucket))


@pytest.fixture
def worker_processes(
    temporal_server: TemporalDevServer, db_dsn: str, task_queue: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two `connector-push worker` processes on the test's task queue."""
    env = {
        **os.environ,
        "DATABASE_URL": db_dsn,
        "TEMPORAL_ADDRESS": temporal_server.address,
        "CONNECTOR_PUSH_TASK_QUEUE": task_queue,
        "CONNECTOR_PUSH_LOG_LEVEL": "WARNING",
    }
    command = [sys.executable, "-m", "cli", "worker"]
    processes = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL) for _ in "ab"]
    yield processes
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


async def wait_for_pollers(client: Client, task_queue: str, count: int) -> None:
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )

    async def identities() -> set[str]:
        pollers = (await client.workflow_service.describe_task_queue(request)).pollers
        return {p.identity for p in pollers}

    await eventually(identities, lambda found: len(found) >= count, timeout_s=60, interval_s=0.2)


@pytest.mark.slow(seconds=50)
@pytest.mark.timeout(300)  # paced by the profile's windows; ~50 s quiet, 111 s loaded
async def test_two_worker_processes_keep_every_window_within_the_profile_limit(
    db_pool: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    remote: BackgroundSandbox,
    sandbox: SandboxClient,
    worker_processes: list[subprocess.Popen[bytes]],
) -> None:
    limit, creates = 40, 90
    ids = await seed(db_pool, limited_manifest(remote.url, limit), creates, task_queue)
    await limit_sandbox(sandbox, limit + 15)
    # The worker processes turn the limit on at start (worker.runtime.ensure_rate_limits).
    await wait_for_pollers(temporal_client, task_queue, 2)

    await push_all(db_pool, temporal_client, task_queue, ids)
    await wait_for_creates(sandbox, creates, timeout_s=120)
    report = await sandbox.rate_limit()

    assert report.throttled == {}  # the remote never had to refuse
    assert busiest_window(report.applied) <= limit * (1 + WINDOW_TOLERANCE)
    assert all(p.poll() is None for p in worker_processes)


@pytest.mark.slow(seconds=40)
@pytest.mark.timeout(300)
async def test_a_burst_takes_as_long_as_the_profile_limit_says(
    db_pool: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    remote: BackgroundSandbox,
    sandbox: SandboxClient,
) -> None:
    limit, creates = 30, 60
    ids = await seed(db_pool, limited_manifest(remote.url, limit), creates, task_queue)
    await limit_sandbox(sandbox, limit + 15)
    await ensure_fairness_limit(temporal_client, task_queue)

    async with remote_http_client() as http:
        async with build_worker(temporal_client, db_pool, http, task_queue):
            await push_all(db_pool, temporal_client, task_queue, ids)
            await wait_for_creates(sandbox, creates, timeout_s=120)
        history = await temporal_client.get_workflow_handle(
            workflow_id(link_key(OWNER, "push-contact", "Contact", ids[0], "remote-contacts"))
        ).fetch_history()
    report = await sandbox.rate_limit()

    times = sorted(r.at for r in report.applied)
    # A full window's worth may pass at once; the rest needs the declared rate.
    expected_s = (creates - limit) / (limit / WINDOW_S)
    assert times[-1] - times[0] >= expected_s
    assert report.throttled == {}
    # The priority is an attribute of the schedule command: a recorded run replays.
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
    replayer = Replayer(
        workflows=[LinkWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )
    await replayer.replay_workflow(WorkflowHistory.from_json("rl", history.to_json()))
