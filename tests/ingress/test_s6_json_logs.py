"""SPEC S-6: the ingress process logs as the worker does, one JSON object a line with the
worker's redaction (`services.log_format`), so a decoded request path holding `%0A`
cannot forge a line of its own. The path reaches the log through the over-capacity
warning (ING-2), which names the request's path."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import httpx

from tests.ingress.process_support import ingress_process
from tests.ingress.support import policy_document

FORGED = '{"level":"ERROR","msg":"forged"}'
PATH = "/nowhere%0A" + FORGED.replace('"', "%22").replace("{", "%7B").replace("}", "%7D")


async def _over_capacity(port: int) -> None:
    """Two connections held open (their heads not started), so a third is over the bound
    of two (and within uvicorn's backstop, twice that); retried until the server has
    counted them (no sleep as synchronisation)."""
    holders = [(await asyncio.open_connection("127.0.0.1", port))[1] for _ in range(2)]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            async with asyncio.timeout(10):
                while (await client.get(PATH)).status_code != 503:
                    pass
    finally:
        for holder in holders:
            holder.close()


async def test_s6_the_ingress_logs_json_lines_a_path_cannot_break(
    tmp_path: Path, db_dsn: str
) -> None:
    document = policy_document(max_connections=2)
    with tempfile.TemporaryFile() as stderr:
        async with ingress_process(tmp_path, db_dsn, document, stderr) as (_, port):
            await _over_capacity(port)
        stderr.seek(0)
        lines = stderr.read().decode().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    (warning,) = [r for r in records if "over_capacity" in r["msg"]]
    assert warning["level"] == "WARNING" and warning["msg"].startswith("/nowhere\n" + FORGED)
    assert all(r["msg"] != "forged" for r in records)
