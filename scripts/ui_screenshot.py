"""Screenshot a parked link's workflow page in the dev stack's Temporal UI (issue 14 item 5).

    make dev                                    # in another terminal
    .venv/bin/python scripts/ui_screenshot.py --prepare

`--prepare` parks a create the way an operator meets one: the sandbox loses the
answer to a company POST after creating it (`reset_after_effect`), so the link
waits for `reconcile`. Without it, the first parked link is shown (or
`--workflow-id`). The picture: the workflow's User Metadata tab (summary, static
details, and the current details with the remedy and the JSON template to paste
into More Actions → Send an Update).

Needs Debian's headless browser (`apt-get install -y chromium`); the test suite
does not. Chromium is driven over the DevTools protocol with a small stdlib
websocket client, so nothing is added to the project's dependencies.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import httpx
from temporalio.client import Client

from cli.stack.devconfig import load_dev_config
from sandbox.client import SandboxClient
from sandbox.faults import FaultRuleSpec

ROOT = Path(__file__).resolve().parents[1]
PARKED = 'NeedsOperator = true AND ExecutionStatus = "Running"'


class DevTools:
    """One DevTools page session over a minimal RFC 6455 client (text frames only)."""

    def __init__(self, ws_url: str) -> None:
        url = urlparse(ws_url)
        self._sock = socket.create_connection((url.hostname, url.port or 80), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self._sock.sendall(
            f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self._sock.recv(1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"DevTools refused the websocket: {head!r}")
        self._next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        self._send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._recv())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def _send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        size = len(data)
        if size < 126:
            header = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 1 << 16:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self._sock.sendall(header + mask + masked)

    def _recv(self) -> str:
        chunks = []
        while True:
            first, second = self._exactly(2)
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", self._exactly(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", self._exactly(8))
            chunks.append(self._exactly(size))
            if first & 0x80:  # FIN
                return b"".join(chunks).decode()

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("DevTools closed the connection")
            data += chunk
        return data


def wait_for(probe: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


async def prepare(client: Client) -> None:
    """Park a company create whose POST landed but whose answer was lost."""
    cfg = load_dev_config()
    async with httpx.AsyncClient(timeout=10) as http:
        sandbox = SandboxClient(f"http://{cfg.sandbox.host}:{cfg.sandbox.port}", http)
        await sandbox.add_fault(
            FaultRuleSpec(
                method="POST", path="/crm/v3/objects/companies", action="reset_after_effect"
            )
        )
    save = [sys.executable, "-m", "cli", "save", "--owner-key", "demo-owner", "--user", "alice"]
    records = [
        ("push-contact", "remote-contacts", "Contact", "c-002"),  # a-002's primary contact
        ("push-company", "remote-companies", "Account", "a-002"),
    ]
    for slot, destination, source_object, record_id in records:
        where = ["--action-slot", slot, "--destination-slot", destination]
        what = ["--source-object", source_object, "--record-id", record_id]
        subprocess.run([*save, *where, *what], check=True)
        await asyncio.sleep(3)  # the association target finalizes first (a demo, not a test)


async def parked_workflow(client: Client, workflow_id: str | None) -> tuple[str, str]:
    """(workflow id, run id) of the given workflow, or of the first parked one."""
    if workflow_id is None:
        deadline = time.monotonic() + 60
        while workflow_id is None and time.monotonic() < deadline:
            async for found in client.list_workflows(PARKED, limit=1):
                workflow_id = found.id
            await asyncio.sleep(0.5)
        if workflow_id is None:
            raise SystemExit(f"no workflow matches {PARKED!r}; try --prepare")
    described = await client.get_workflow_handle(workflow_id).describe()
    return workflow_id, described.run_id


def browser(port: int, profile: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("chromium not found: apt-get install -y chromium")
    args = [
        binary,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--remote-debugging-port={port}",
        f"--user-data-dir={profile}",
        "--window-size=1440,1560",
        "about:blank",
    ]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def page_socket(port: int) -> str:
    def probe() -> str | None:
        try:
            pages = httpx.get(f"http://127.0.0.1:{port}/json", timeout=2).json()
        except httpx.HTTPError:
            return None
        urls = [p["webSocketDebuggerUrl"] for p in pages if p.get("type") == "page"]
        return urls[0] if urls else None

    found: str = wait_for(probe, "chromium's DevTools endpoint")
    return found


def shoot(page: DevTools, path: Path) -> None:
    shot = page.call("Page.captureScreenshot", format="png")
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def capture(url: str, out: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = browser(port, profile)
        try:
            page = DevTools(page_socket(port))
            page.call("Page.enable")
            page.call("Page.navigate", url=url)
            # UI 2.54 renders the summary and details' markdown in frames (/render?content=).
            rendered = (
                "[...document.querySelectorAll('iframe')]"
                ".some(f => decodeURIComponent(f.src).includes(%s))"
            )
            # The current details come from the workflow's metadata query (a live worker).
            details = rendered % json.dumps("Send an Update")
            wait_for(lambda: page.evaluate(details), "the current details", 120)
            time.sleep(3)  # let the frames finish rendering (a picture, not a test)
            shoot(page, out)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="park a company create first")
    parser.add_argument("--workflow-id", help="default: the first parked link")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui-parked-link.png")
    args = parser.parse_args()
    cfg = load_dev_config().temporal
    client = await Client.connect(cfg.address, namespace=cfg.namespace)
    if args.prepare:
        await prepare(client)
    workflow_id, run_id = await parked_workflow(client, args.workflow_id)
    ui = f"http://{cfg.frontend_ip}:{cfg.ui_port}"
    # UI 2.54 shows the summary and the current details on the User Metadata tab.
    workflow = f"/namespaces/{cfg.namespace}/workflows/{quote(workflow_id, safe='')}/{run_id}"
    url = f"{ui}{workflow}/user-metadata"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    capture(url, args.out)


if __name__ == "__main__":
    asyncio.run(main())
