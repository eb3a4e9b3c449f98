"""`run_cli`: `connector-push ARGS` as a real process, forked from a server that has
already imported the CLI (tests/cli_zygote.py explains why and what stays real).

One server per test process, started on first use and stopped at exit. Same contract as
`subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True)`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], str, str] | None = None


def _start() -> tuple[subprocess.Popen[bytes], str, str]:
    workdir = tempfile.mkdtemp(prefix="cp-cli-zygote-")
    path = os.path.join(workdir, "cli.sock")
    # No terminal size: rich reads COLUMNS/LINES when a module's Console is built, which
    # here is at the server's imports, not at each command's start (tests/conftest.py).
    env = {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES"}}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.cli_zygote", path],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # after every import: the first request waits for it
    if line.strip() != b"ready":
        process.kill()
        raise RuntimeError(f"the CLI fork server did not start (exit {process.wait()})")
    atexit.register(_stop, process, workdir)
    return process, path, workdir


def _stop(process: subprocess.Popen[bytes], workdir: str) -> None:
    process.kill()
    process.wait()
    for name in os.listdir(workdir):
        os.unlink(os.path.join(workdir, name))
    os.rmdir(workdir)


def _socket_path() -> str:
    global _server
    with _lock:
        if _server is None or _server[0].poll() is not None:
            _server = _start()
        return _server[1]


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = 90.0,
) -> subprocess.CompletedProcess[str]:
    """Run `connector-push ARGS` as its own process and wait for it."""
    request_env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="cp-cli-run-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        request = {
            "args": list(args),
            "env": request_env,
            "cwd": str(cwd or REPO_ROOT),
            "stdout": out,
            "stderr": err,
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(_socket_path())
            conn.sendall(json.dumps(request).encode() + b"\n")
            replies = conn.makefile("rb")
            pid = json.loads(replies.readline())["pid"]
            try:
                returncode = json.loads(replies.readline())["returncode"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["connector-push", *args], timeout) from None
        stdout = Path(out).read_text(errors="replace") if os.path.exists(out) else ""
        stderr = Path(err).read_text(errors="replace") if os.path.exists(err) else ""
    return subprocess.CompletedProcess(["connector-push", *args], returncode, stdout, stderr)
