"""A fresh, private stack for one benchmark run: Temporal dev server (the pragmas of
temporal-dev.yaml), embedded Postgres with the demo pack and N generated contacts,
and the sandbox remote over HTTP. Nothing is shared with `make dev` or the tests."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import yaml
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from cli.stack.devconfig import load_dev_config
from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import free_ports, stop_process
from cli.stack.temporal import TemporalDevServer
from db.migrate import apply_migrations
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DATABASE = "bench"
FIELDS = ["FirstName", "LastName", "Email", "Phone", "remote_id__c", "remote_provenance__c"]


@dataclass(frozen=True)
class BenchStack:
    client: Client
    dsn: str
    admin_dsn: str  # another database on the same server: reading stats there is not counted
    sandbox_url: str
    # The stack's server processes by component, for the CPU split (bench.cpu).
    processes: Mapping[str, int]


def record_id(i: int) -> str:
    return f"bench-c-{i:05d}"


def _records(n: int) -> dict[str, object]:
    records = [
        {
            "object": "Contact",
            "id": record_id(i),
            "fields": {"FirstName": "Bench", "LastName": f"N{i}", "Email": f"b{i}@example.com"},
        }
        for i in range(n)
    ]
    grant = {"user": "bench", "object": "Contact", "records": "*", "fields": FIELDS}
    return {"records": records, "grants": [grant]}


async def _seed(dsn: str, sandbox_url: str, n: int, rate_limited: bool) -> None:
    await apply_migrations(dsn)
    text = (EXAMPLES / "demo-pack.yaml").read_text()
    manifest = yaml.safe_load(
        re.sub(r"baseUrl: http://127\.0\.0\.1:\d+", f"baseUrl: {sandbox_url}", text)
    )
    if not rate_limited:
        for profile in manifest["profiles"]:
            profile.pop("rateLimit", None)
    conn = await asyncpg.connect(dsn)
    try:
        await apply_pack(conn, manifest)
        await load_records(conn, parse_records_document(_records(n)))
    finally:
        await conn.close()


def _postmaster_pid(pg: EmbeddedPostgres) -> int:
    """The postmaster's pid: the first line of its data directory's postmaster.pid."""
    return int((pg.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


@contextmanager
def _sandbox_process(port: int, log: Path, config: Path) -> Iterator[tuple[str, int]]:
    """The sandbox in its own process, so it does not share the worker's interpreter lock
    (in a thread it would slow the product and flatter the floor)."""
    args = ["sandbox", "--host", "127.0.0.1", "--port", str(port), "--config", str(config)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", *args], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"{url}/_sandbox/health"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sandbox did not start; see {log}")
            time.sleep(0.1)
        yield url, process.pid
    finally:
        stop_process(process, 30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


@asynccontextmanager
async def bench_stack(
    n: int, rate_limited: bool = True, sandbox_config: Path = EXAMPLES / "sandbox.yaml"
) -> AsyncIterator[BenchStack]:
    """`rate_limited=False` drops the demo pack's remote budgets (PROF-3), for a bench
    that measures something other than the remote's pace; `sandbox_config` picks the
    sandbox's mode (P6 runs against the hubspot mode's strict limiter)."""
    dev = load_dev_config()
    with tempfile.TemporaryDirectory(prefix="cp-bench-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the unprivileged postgres user must reach its data dir
        pg_port, frontend, ui, sandbox_port = free_ports(4)
        pg = EmbeddedPostgres(root / "pg", dev.postgres.host, pg_port)
        temporal_config = dev.temporal.model_copy(update={"frontend_port": frontend, "ui_port": ui})
        temporal = TemporalDevServer(
            config=temporal_config,
            db_file=root / "temporal.sqlite",
            ui=False,
            log_path=root / "temporal.log",
        )
        pg.start()
        temporal.start()
        try:
            sandbox = _sandbox_process(sandbox_port, root / "sandbox.log", sandbox_config)
            with sandbox as (sandbox_url, sandbox_pid):
                admin = await asyncpg.connect(pg.dsn("postgres"))
                await admin.execute(f'CREATE DATABASE "{DATABASE}"')
                await admin.close()
                dsn = pg.dsn(DATABASE)
                await _seed(dsn, sandbox_url, n, rate_limited)
                await temporal.wait_ready()
                client = await Client.connect(
                    temporal.address,
                    namespace=temporal_config.namespace,
                    data_converter=pydantic_data_converter,
                )
                assert temporal.pid is not None  # started above
                yield BenchStack(
                    client=client,
                    dsn=dsn,
                    admin_dsn=pg.dsn("postgres"),
                    sandbox_url=sandbox_url,
                    processes={
                        "temporal": temporal.pid,
                        "postgres": _postmaster_pid(pg),
                        "sandbox": sandbox_pid,
                    },
                )
        finally:
            temporal.stop()
            pg.stop()
