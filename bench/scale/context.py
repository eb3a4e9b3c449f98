"""What every part of bench-scale shares: the server, fresh databases on it, and how to
run the product's CLI against one of them."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx

from bench.scale.runner import Cli, Launcher, popen_launcher
from cli.stack.postgres import free_port
from db.migrate import apply_migrations

Figures = dict[str, float | str]


@dataclass
class Context:
    admin_dsn: str
    workdir: Path
    launcher: Launcher = popen_launcher
    template: str | None = None  # a migrated database to clone (tests); else migrate anew
    # An address where no Temporal server listens: push's wake-ups are deferred to the
    # relay (API-2) and the part measures admission alone.
    temporal_address: str = field(default_factory=lambda: f"127.0.0.1:{free_port('127.0.0.1')}")

    def cli(self, dsn: str, part: str) -> Cli:
        workdir = self.workdir / part
        workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "DATABASE_URL": dsn,
            "TEMPORAL_ADDRESS": self.temporal_address,
            "COLUMNS": "200",
        }
        return Cli(self.launcher, env, workdir)

    @asynccontextmanager
    async def database(self, part: str) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
        """A fresh migrated database for one part, and a connection to it; dropped after."""
        name = f"scale_{part}_{uuid.uuid4().hex[:8]}"
        clause = f' TEMPLATE "{self.template}"' if self.template else ""
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"{clause}')
        finally:
            await admin.close()
        dsn = str(httpx.URL(self.admin_dsn).copy_with(path=f"/{name}"))
        if self.template is None:
            await apply_migrations(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            yield dsn, conn
        finally:
            await conn.close()
            admin = await asyncpg.connect(self.admin_dsn)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()
