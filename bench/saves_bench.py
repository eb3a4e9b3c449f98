"""Benchmark P7 (issue 12): saves per second admitted through `POST /v1/saves/batch`,
as a fraction of pgbench's single-row INSERT TPS on the same Postgres at the same
concurrency, measured in one run (target >= 0.2).

The ingress runs as its own process (`python -m ingress`) with the save API
configured and no Temporal (admission is what is measured; wake-ups are deferred
to the relay). Every save is a different record of the demo pack's contact slot,
so each one is a full admission that reserves a create attempt. Results are
merged into `bench/results/latest.json`.

    python -m bench.saves_bench [--concurrency 10] [--seconds 10] [--batch 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import asyncpg
import httpx
import yaml

from bench.ingress_bench import (
    ROOT,
    _wait_healthy,
    pgbench_tps,
    postgres_server,
    prepare_database,
    record,
)
from cli.stack.postgres import free_port
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document

KEY: Final = "bench-save-api-key"
EXAMPLES: Final = ROOT / "examples"
FIELDS: Final = ["FirstName", "LastName", "Email", "Phone", "remote_id__c", "remote_provenance__c"]


def _policy(batch: int) -> dict[str, object]:
    """A save API with one client; the ingress file needs at least one endpoint."""
    webhook = {
        "name": "unused",
        "kind": "webhook",
        "path": "/webhooks/unused",
        "signature": {
            "scheme": "v3",
            "secret_env": "BENCH_WEBHOOK_SECRET",
            "public_base_url": "http://127.0.0.1",
            "signature_header": "x-hubspot-signature-v3",
            "timestamp_header": "x-hubspot-request-timestamp",
        },
        "event_type_field": "subscriptionType",
        "identity": {"kind": "legacy", "path": "eventId"},
    }
    save_api = {
        "clients": [{"name": "bench", "key_env": "BENCH_SAVE_KEY", "owners": ["demo-owner"]}],
        "max_batch": batch,
        "deadline_ms": 30_000,  # throughput is measured here, not latency
        "wake_timeout_ms": 0,
    }
    return {"profile": "development", "endpoints": [webhook], "save_api": save_api}


async def seed(dsn: str, records: int) -> None:
    """The demo pack and `records` contacts alice may read, written in bulk."""
    conn = await asyncpg.connect(dsn)
    try:
        await apply_pack(conn, yaml.safe_load((EXAMPLES / "demo-pack.yaml").read_text()))
        await conn.execute(
            "INSERT INTO crm_record (source_object, record_id, fields, owner_key) "
            "SELECT 'Contact', 'b-' || lpad(g::text, 7, '0'), "
            "jsonb_build_object('FirstName', 'B', 'Email', 'b' || g || '@bench.test'), "
            "'demo-owner' FROM generate_series(1, $1) g",
            records,
        )
        grants = {"user": "alice", "object": "Contact", "records": "*", "fields": FIELDS}
        await load_records(conn, parse_records_document({"records": [], "grants": [grants]}))
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def save_api_process(dsn: str, batch: int) -> AsyncIterator[str]:
    """`python -m ingress` with the save API; yields its base URL once /readyz answers."""
    workdir = Path(tempfile.mkdtemp(prefix="cp-bench-saves-"))
    policy = workdir / "policy.yaml"
    policy.write_text(yaml.safe_dump(_policy(batch)))
    port = free_port("127.0.0.1")
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "BENCH_WEBHOOK_SECRET": "unused",
        "BENCH_SAVE_KEY": KEY,
        "CONNECTOR_PUSH_INGRESS_PORT": str(port),
    }
    env.pop("TEMPORAL_ADDRESS", None)
    log = (workdir / "ingress.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "ingress", str(policy)], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(base_url, process)
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _batch(numbers: list[int]) -> dict[str, object]:
    return {
        "saves": [
            {
                "ownerKey": "demo-owner",
                "actionSlot": "push-contact",
                "destinationSlot": "remote-contacts",
                "sourceObject": "Contact",
                "recordId": f"b-{n:07}",
                "userId": "alice",
            }
            for n in numbers
        ]
    }


class Load:
    """Closed loop, one batch in flight per connection, each save a fresh record."""

    def __init__(self, client: httpx.AsyncClient, batch: int, records: int) -> None:
        self._client, self._batch = client, batch
        self._numbers = itertools.count(1)
        self._records = records
        self.admitted = 0

    async def send(self) -> bool:
        numbers = [next(self._numbers) for _ in range(self._batch)]
        if numbers[-1] > self._records:
            return False
        response = await self._client.post(
            "/v1/saves/batch", json=_batch(numbers), headers={"authorization": f"Bearer {KEY}"}
        )
        if response.status_code != 200:
            raise RuntimeError(f"batch answered {response.status_code}: {response.text[:200]}")
        results = response.json()["results"]
        if any(r["decision"] != "create_reserved" for r in results):
            raise RuntimeError(f"unexpected decision: {results[0]}")
        self.admitted += len(results)
        return True

    async def run(self, concurrency: int, seconds: float) -> float:
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop_at and await self.send():
                pass

        before, started = self.admitted, time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return (self.admitted - before) / (time.perf_counter() - started)


async def run_saves_bench(
    concurrency: int = 10, seconds: float = 10.0, batch: int = 100, records: int = 120_000
) -> dict[str, float]:
    """Measure P7, write it to `bench/results/latest.json`, return it."""
    with postgres_server() as (admin_dsn, _, _):
        dsn = await prepare_database(admin_dsn)
        await seed(dsn, records)
        baseline = await asyncio.to_thread(pgbench_tps, dsn, concurrency, seconds)
        async with (
            save_api_process(dsn, batch) as base_url,
            httpx.AsyncClient(base_url=base_url, timeout=30.0) as client,
        ):
            load = Load(client, batch, records)
            await load.run(concurrency, min(2.0, seconds))  # warm-up
            saves = await load.run(concurrency, seconds)
    figures = {"P7": round(saves / baseline, 3), "P7_saves_per_s": round(saves, 1)}
    # The ingress is one Python process and CPU-bound: other load moves the figure a lot.
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"P7 save API admissions {saves:.0f} saves/s (batches of {batch}) vs pgbench "
        f"single-row INSERT {baseline:.0f} TPS (-M prepared), same Postgres, same run, "
        f"concurrency {concurrency}: {figures['P7']}x (target >= 0.2x); "
        f"load average {load_average}"
    )
    record(figures)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(run_saves_bench(args.concurrency, args.seconds, args.batch))


if __name__ == "__main__":
    main()
