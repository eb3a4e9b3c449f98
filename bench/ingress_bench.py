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
import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Final

import asyncpg
import httpx
import yaml

from cli.stack.postgres import EmbeddedPostgres, free_port, postgres_bin_dir
from db.migrate import apply_migrations
from ingress.app import wall_clock_ms

ROOT: Final = Path(__file__).resolve().parents[1]
RESULTS: Final = ROOT / "bench" / "results" / "latest.json"
SECRET: Final = "bench-webhook-secret"
PUBLIC_BASE: Final = "http://127.0.0.1"
PATH: Final = "/webhooks/bench"
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


# -- load ------------------------------------------------------------------------
#
# The load generator runs in its own process (`--load`, on uvloop when available),
# so its CPU is its own and measurable, and it does as little as a sender can:
# a body from a template, an HMAC keyed once, a raw keep-alive HTTP/1.1 socket.
# It shares the machine's cores with the ingress and Postgres; its CPU share
# during the saturation phase is printed with the result.

# json.dumps([event]) of the event below, as a template (same bytes, a fraction of the CPU).
_BODY: Final = (
    '[{"appId": 7, "portalId": 42, "subscriptionId": 9, "eventId": %d, "occurredAt": %d, '
    '"subscriptionType": "contact.propertyChange", "objectId": %d, "propertyName": "email", '
    '"propertyValue": "user%d@example.test", "changeSource": "CRM", "attemptNumber": 0}]'
)
_HEAD: Final = (
    f"POST {PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n".encode()
    + b"content-length: %d\r\nx-hubspot-signature-v3: %s\r\nx-hubspot-request-timestamp: %d\r\n\r\n"
)
_CONTENT_LENGTH: Final = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def _delivery(n: int, occurred_at: int) -> bytes:
    """A fresh single-event HubSpot-shaped delivery (a new business identity each time)."""
    return (_BODY % (n, occurred_at, 1000 + n, n)).encode()


class Signer:
    """`sign_v3` for one method and URI, with the HMAC keyed and fed that prefix once."""

    def __init__(self, secret: str, method: str, uri: str) -> None:
        self._prefix = hmac.new(secret.encode(), (method + uri).encode(), hashlib.sha256)

    def sign(self, body: bytes, timestamp_ms: int) -> bytes:
        mac = self._prefix.copy()
        mac.update(body)
        mac.update(str(timestamp_ms).encode())
        return base64.b64encode(mac.digest())


class Connection:
    """One keep-alive HTTP/1.1 connection. A minimal client on purpose: a general one
    (httpx) costs more CPU per request than the ingress does, and the generator shares
    the machine with the ingress and Postgres."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post(self, request: bytes) -> int:
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = _CONTENT_LENGTH.search(head)
        if length is not None:
            await self._reader.readexactly(int(length.group(1)))
        return status

    def close(self) -> None:
        self._writer.close()


class Sender:
    """Signs and sends one fresh delivery per call; anything but 202 aborts the run."""

    def __init__(self) -> None:
        self._next = 0
        self._signer = Signer(SECRET, "POST", PUBLIC_BASE + PATH)
        self.admitted = 0

    def request(self) -> bytes:
        self._next += 1
        timestamp = wall_clock_ms()
        body = _delivery(self._next, timestamp)
        return _HEAD % (len(body), self._signer.sign(body, timestamp), timestamp) + body

    async def send(self, connection: Connection) -> None:
        status = await connection.post(self.request())
        if status != 202:
            raise RuntimeError(f"admission answered {status}")
        self.admitted += 1


async def saturate(sender: Sender, connections: list[Connection], seconds: float) -> float:
    """Closed loop, one request in flight per connection; returns admissions per second."""
    stop_at = time.perf_counter() + seconds

    async def worker(connection: Connection) -> None:
        while time.perf_counter() < stop_at:
            await sender.send(connection)

    before, started = sender.admitted, time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    return (sender.admitted - before) / (time.perf_counter() - started)


async def paced(
    sender: Sender, connections: list[Connection], rate: float, seconds: float
) -> list[float]:
    """Open loop at `rate` per second; latencies (ms) from each request's scheduled time,
    so a generator falling behind shows up as latency rather than hiding it."""
    interval = 1.0 / rate
    total = int(rate * seconds)
    start = time.perf_counter()
    latencies: list[float] = []
    queue: asyncio.Queue[float] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(start + i * interval)

    async def worker(connection: Connection) -> None:
        while not queue.empty():
            scheduled = queue.get_nowait()
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await sender.send(connection)
            latencies.append((time.perf_counter() - scheduled) * 1000)

    await asyncio.gather(*(worker(c) for c in connections))
    return latencies


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


async def generate_load(port: int, concurrency: int, seconds: float) -> dict[str, float]:
    """Warm-up, saturation (admissions/s), then p50/p99 at half that rate."""
    connections = [await Connection.open(port) for _ in range(concurrency)]
    sender = Sender()
    try:
        await saturate(sender, connections, min(2.0, seconds))  # warm-up
        cpu_before, admitted_before = _cpu_s(), sender.admitted
        admissions = await saturate(sender, connections, seconds)
        cpu = _cpu_s() - cpu_before
        requests = sender.admitted - admitted_before
        latencies = await paced(sender, connections, admissions / 2, seconds)
    finally:
        for connection in connections:
            connection.close()
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "admissions": admissions,
        "p50_ms": quantiles[49],
        "p99_ms": quantiles[98],
        "generator_cpu_share": cpu / seconds,
        "generator_us_per_request": cpu / requests * 1e6,
    }


def _run_load_process(port: int, concurrency: int, seconds: float) -> None:
    """The `--load` entry point: one JSON line on stdout."""
    coroutine = generate_load(port, concurrency, seconds)
    try:
        import uvloop  # optional: absent on Windows
    except ImportError:
        result = asyncio.run(coroutine)
    else:
        result = uvloop.run(coroutine)
    print(json.dumps(result))


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


def record(figures: dict[str, float], path: Path = RESULTS) -> None:
    """Read-modify-write: keep every key another benchmark wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.exists() else {}
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
        _run_load_process(args.load, args.concurrency, args.seconds)
    else:
        asyncio.run(run_ingress_bench(args.concurrency, args.seconds, args.processes))


if __name__ == "__main__":
    main()
