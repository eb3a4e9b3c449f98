"""SPEC S-6 at the ingress: a request head is bounded in size and header count, not only in
time. Past `max_header_bytes` or `max_headers` the server answers 431 at once and drops
the rest unparsed, so a 5 MB flood of small headers costs the real ingress process (run
as `python -m ingress`) at most 10 MB of memory."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.ingress.process_support import ingress_process
from tests.ingress.support import live_server, make_config, policy_document

FLOOD_BYTES = 5 * 1024 * 1024
MAX_GROWTH_KB = 10 * 1024
QUICK_S = 3.0  # the shared machine; unbounded, the flood takes far longer and is not refused


def _head(headers: bytes) -> bytes:
    return b"POST /webhooks/crm HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 2\r\n" + headers


async def _answer_to(port: int, head: bytes) -> tuple[bytes, float]:
    """Send `head` (and, if it ends, an empty body) while reading the answer; the status
    line and how long it took to come."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()

    async def send() -> None:
        try:
            writer.write(head + b"\r\n[]")
            await writer.drain()
        except ConnectionError:  # the server may close before the flood is all written
            pass

    sending = asyncio.create_task(send())
    async with asyncio.timeout(30):
        status = await reader.readline()
        elapsed = time.monotonic() - started
        while await reader.read(65536):  # the server half-closes after its answer
            pass
    await sending
    writer.close()
    return status, elapsed


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


async def test_s6_a_5mb_flood_of_small_headers_is_refused_431_within_10mb(
    tmp_path: Path, db_dsn: str
) -> None:
    async with ingress_process(tmp_path, db_dsn, policy_document()) as (process, port):
        # Warm the refusal path, then measure from its settled size and a reset peak.
        await _answer_to(port, _head(b"x-a: b\r\n" * 200))
        before = _kb(process.pid, "VmRSS")
        Path(f"/proc/{process.pid}/clear_refs").write_text("5")  # resets VmHWM
        small = b"x-a: b\r\n"
        status, elapsed = await _answer_to(port, _head(small * (FLOOD_BYTES // len(small))))
        peak = _kb(process.pid, "VmHWM")
        assert status.startswith(b"HTTP/1.1 431"), status
        assert elapsed < QUICK_S
        assert peak - before <= MAX_GROWTH_KB, f"grew {peak - before} kB"
        async with httpx.AsyncClient(timeout=5) as client:  # still serving
            assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200


async def test_s6_header_count_and_size_bounds_come_from_the_policy(db_dsn: str) -> None:
    config = make_config(max_headers=20, max_header_bytes=4096)
    async with live_server(config, db_dsn) as live:
        port = int(live.base_url.rsplit(":", 1)[1])
        many, _ = await _answer_to(port, _head(b"x-a: b\r\n" * 21))
        big, _ = await _answer_to(port, _head(b"x-a: " + b"b" * 4096 + b"\r\n"))
        # One header larger than a read: refused while it is still arriving.
        huge, _ = await _answer_to(port, _head(b"x-a: " + b"b" * 2_000_000 + b"\r\n"))
        within, _ = await _answer_to(port, _head(b"x-a: b\r\n" * 15))
    assert many.startswith(b"HTTP/1.1 431") and big.startswith(b"HTTP/1.1 431")
    assert huge.startswith(b"HTTP/1.1 431")
    assert within.startswith(b"HTTP/1.1 401")  # within the bounds: on to the signature check
