"""`python -m bench.scale` (`make bench-scale`): the product at N = 100,000 and 1,000,000
on a stock Postgres (issue 34 item 5).

A private embedded Postgres with initdb's defaults (durable; no raised
max_locks_per_transaction, shared_buffers or max_connections: Postgres's stock 100),
rows inserted by COPY, and each part measured through the product's own CLI as a
subprocess: `listing` (status, links find, a cursor page), `revalidation` (plan,
validate, apply and P4's floor), `push` (push --all, interrupted and resumed),
`backfill` (plan, then apply interrupted and resumed). Progress on stderr, a table on
stdout, figures merged into bench/results/scale-latest.json.

    python -m bench.scale [--n 100000,1000000] [--only push,backfill] [--admin-dsn DSN]

`--admin-dsn` runs on an existing server instead (its settings are recorded as they are).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from bench.scale.context import Context
from bench.scale.harness import RESULTS, run_scale, selected, table, write
from cli.stack.postgres import EmbeddedPostgres, free_port

STOCK_MAX_CONNECTIONS: Final = 100  # Postgres's default (initdb's, where memory allows)


@contextmanager
def stock_postgres(root: Path) -> Iterator[str]:
    """A fresh durable cluster with Postgres's default settings; yields its admin DSN."""
    root.chmod(0o755)  # the unprivileged postgres user must reach its data dir
    server = EmbeddedPostgres(
        root / "pg",
        "127.0.0.1",
        free_port("127.0.0.1"),
        durable=True,
        max_connections=STOCK_MAX_CONNECTIONS,
    )
    server.start()
    try:
        yield server.dsn("postgres")
    finally:
        server.stop()


async def main(ns: list[int], parts: list[str], admin_dsn: str | None, out: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="cp-bench-scale-"))
    try:
        with contextmanager(_server)(root, admin_dsn) as dsn:
            results = await run_scale(Context(dsn, root / "runs"), ns, parts)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(results, ns))
    write(results, out)
    print(f"written to {out}")


def _server(root: Path, admin_dsn: str | None) -> Iterator[str]:
    if admin_dsn is not None:
        yield admin_dsn
        return
    with stock_postgres(root) as dsn:
        yield dsn


def _ns(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default=os.environ.get("N") or "100000,1000000")
    parser.add_argument("--only", default=os.environ.get("ONLY"), help="e.g. push,backfill")
    parser.add_argument("--admin-dsn", default=None, help="an existing server instead")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    # `kill PID` stops the run like Ctrl-C: the private Postgres is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asyncio.run(main(_ns(args.n), selected(args.only), args.admin_dsn, args.out))
