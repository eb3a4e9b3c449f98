"""The P3 load generator: signed single-event webhook deliveries over raw keep-alive
sockets, saturating, then paced; run in its own process by `bench.ingress_bench --load`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import statistics
import time
from typing import Final

from ingress.app import wall_clock_ms

SECRET: Final = "bench-webhook-secret"
PUBLIC_BASE: Final = "http://127.0.0.1"
PATH: Final = "/webhooks/bench"

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


def run_load_process(port: int, concurrency: int, seconds: float) -> None:
    """The `--load` entry point: one JSON line on stdout."""
    coroutine = generate_load(port, concurrency, seconds)
    try:
        import uvloop  # optional: absent on Windows
    except ImportError:
        result = asyncio.run(coroutine)
    else:
        result = uvloop.run(coroutine)
    print(json.dumps(result))
