"""Benchmark P3 (issue 7): signed, verified, committed webhook admissions per second,
as a fraction of pgbench's single-row INSERT TPS on the same Postgres at the same
concurrency, measured in one run; then p50/p99 latency at half the admission rate.

The ingress runs as its own process (`python -m ingress`), exactly as served, with
no Temporal configured (admission is what is measured). Postgres is embedded and
durable (fsync on) unless `DATABASE_URL` names a server to use. Results are merged
into `bench/results/latest.json` (other benchmarks write their own keys there).

    python -m bench.ingress_bench [--concurrency 10] [--seconds 10] [--processes 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import asyncpg
import httpx
import yaml

from bench import webhook_load
from bench.webhook_load import PATH, PUBLIC_BASE, SECRET
from cli.stack.postgres import EmbeddedPostgres, free_port, postgres_bin_dir
from db.migrate import apply_migrations

ROOT: Final = Path(__file__).resolve().parents[1]
RESULTS: Final = ROOT / "bench" / "results" / "latest.json"
INSERT_SCRIPT: Final = "INSERT INTO bench_single_row (payload) VALUES ('x');\n"
IDENTITY: Final = {
    "kind": "composite",
    "fields": [
        {"path": "appId", "type": "number"},
        {"path": "portalId", "type": "number"},
        {"path": "subscriptionId", "type": "number"},
        {"path": "eventId", "type": "number"},
        {"path": "occurredAt", "type": "number"},
        {"path": "subscriptionType", "type": "string"},
        {"path": "objectId", "type": "number"},
        {"path": "propertyName", "type": "string", "optional": True},
        {"path": "propertyValue", "type": "string", "optional": True},
    ],
    "attempt_path": "attemptNumber",
}


def _policy() -> dict[str, object]:
    return {
        "profile": "production",
        "ack_drop_endpoints": [],
        "endpoints": [
            {
                "name": "bench",
                "kind": "webhook",
                "path": PATH,
                "signature": {
                    "scheme": "v3",
                    "secret_env": "BENCH_WEBHOOK_SECRET",
                    "public_base_url": PUBLIC_BASE,
                    "signature_header": "x-hubspot-signature-v3",
                    "timestamp_header": "x-hubspot-request-timestamp",
                },
                "event_type_field": "subscriptionType",
                "identity": IDENTITY,
                "routes": {"contact.propertyChange": "remote_property_change"},
            }
        ],
    }


# -- Postgres ------------------------------------------------------------------


@contextlib.contextmanager
def postgres_server() -> Iterator[tuple[str, str, int]]:
    """(admin DSN, host, port): `DATABASE_URL`'s server, else a durable embedded one."""
    if url := os.environ.get("DATABASE_URL"):
        parts = httpx.URL(url)
        yield url, parts.host, parts.port or 5432
        return
    root = Path(tempfile.mkdtemp(prefix="cp-bench-pg-"))
    server = EmbeddedPostgres(root / "data", "127.0.0.1", free_port("127.0.0.1"), durable=True)
    try:
        server.start()
        yield server.dsn("postgres"), server.host, server.port
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def prepare_database(admin_dsn: str) -> str:
    """A fresh, migrated database with the pgbench table; returns its DSN."""
    name = f"cp_bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    dsn = str(httpx.URL(admin_dsn).copy_with(path=f"/{name}"))
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE bench_single_row (id bigserial PRIMARY KEY, payload text NOT NULL)"
        )
    finally:
        await conn.close()
    return dsn


def pgbench_tps(dsn: str, concurrency: int, seconds: float) -> float:
    """pgbench's single-row INSERT TPS at `concurrency` clients (prepared statements)."""
    url = httpx.URL(dsn)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(INSERT_SCRIPT)
    try:
        result = subprocess.run(
            [
                str(postgres_bin_dir() / "pgbench"),
                *("-n", "-M", "prepared", "-c", str(concurrency), "-j", "2"),
                *("-T", str(max(1, round(seconds))), "-f", script.name),
                *("-h", url.host, "-p", str(url.port), "-U", url.username or "postgres"),
                url.path.lstrip("/"),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 120,
        )
    finally:
        Path(script.name).unlink()
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", result.stdout)
    if match is None:
        raise RuntimeError(f"unexpected pgbench output: {result.stdout}")
    return float(match.group(1))


# -- the ingress under test --------------------------------------------------------


@contextlib.asynccontextmanager
async def ingress_process(dsn: str, processes: int = 1) -> AsyncIterator[int]:
    """`python -m ingress` on a free port (`processes` of them sharing it, SO_REUSEPORT);
    yields the port once /readyz answers."""
    workdir = Path(tempfile.mkdtemp(prefix="cp-bench-ingress-"))
    policy = workdir / "policy.yaml"
    policy.write_text(yaml.safe_dump(_policy()))
    port = free_port("127.0.0.1")
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "BENCH_WEBHOOK_SECRET": SECRET,
        "CONNECTOR_PUSH_INGRESS_PORT": str(port),
        "CONNECTOR_PUSH_INGRESS_PROCESSES": str(processes),
    }
    env.pop("TEMPORAL_ADDRESS", None)
    log = (workdir / "ingress.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "ingress", str(policy)], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(base_url, process)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


async def _wait_healthy(base_url: str, process: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client, asyncio.timeout(30):
        while process.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"ingress exited early ({process.returncode})")


async def load_process(port: int, concurrency: int, seconds: float) -> dict[str, float]:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bench.ingress_bench", "--load", str(port)),
        *("--concurrency", str(concurrency), "--seconds", str(seconds)),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"load generator failed ({process.returncode})")
    result: dict[str, float] = json.loads(stdout.decode().strip().splitlines()[-1])
    return result


# -- the run ---------------------------------------------------------------------


def record(
    figures: Mapping[str, object], path: Path = RESULTS, replaces: tuple[str, ...] = ()
) -> None:
    """Read-modify-write: keep every key another benchmark wrote; the keys starting with
    one of `replaces` are this benchmark's own, dropped first so none outlives its run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.exists() else {}
    current = {k: v for k, v in current.items() if not k.startswith(replaces)}
    current.update(figures)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    temporary.replace(path)


async def run_ingress_bench(
    concurrency: int = 10, seconds: float = 10.0, process_counts: Sequence[int] = (1, 2)
) -> dict[str, float]:
    """Measure P3 and its latencies for each ingress process count, write them to
    `bench/results/latest.json`, return them. P3 is the best count's figure.

    The default concurrency is the remote's default `maxConcurrentRequests` per account.
    """
    loads: dict[int, dict[str, float]] = {}
    with postgres_server() as (admin_dsn, _, _):
        dsn = await prepare_database(admin_dsn)
        baseline = await asyncio.to_thread(pgbench_tps, dsn, concurrency, seconds)
        for processes in process_counts:
            async with ingress_process(dsn, processes) as port:
                loads[processes] = await load_process(port, concurrency, seconds)
            _report(processes, loads[processes], baseline, concurrency)
    best = max(loads, key=lambda n: loads[n]["admissions"])
    figures = {
        "P3": round(loads[best]["admissions"] / baseline, 3),
        "P3_processes": best,
        "P3_p50_ms": round(loads[best]["p50_ms"], 2),
        "P3_p99_ms": round(loads[best]["p99_ms"], 2),
        **{
            f"P3_{n}_processes": round(load["admissions"] / baseline, 3)
            for n, load in loads.items()
        },
    }
    print(f"P3 = {figures['P3']}x with {best} ingress process(es) (target >= 0.25x)")
    record(figures)
    return figures


def _report(processes: int, load: dict[str, float], baseline: float, concurrency: int) -> None:
    admissions = load["admissions"]
    print(
        f"P3 [{processes} ingress process(es)] admissions {admissions:.0f}/s vs pgbench "
        f"single-row INSERT {baseline:.0f} TPS (-M prepared), same Postgres, same run, "
        f"concurrency {concurrency}: {admissions / baseline:.3f}x; at {admissions / 2:.0f}/s "
        f"p50 {load['p50_ms']:.2f} ms, p99 {load['p99_ms']:.2f} ms; the load generator "
        f"shared the cores: {load['generator_cpu_share']:.0%} of one core, "
        f"{load['generator_us_per_request']:.0f} us CPU per request",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1, 2], help="ingress process counts"
    )
    parser.add_argument("--load", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load is not None:
        webhook_load.run_load_process(args.load, args.concurrency, args.seconds)
    else:
        asyncio.run(run_ingress_bench(args.concurrency, args.seconds, args.processes))


if __name__ == "__main__":
    main()
