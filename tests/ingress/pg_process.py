"""A Postgres server of the test's own, and a way to hang it: SIGSTOP of its postmaster
and every backend, SIGCONT afterwards (always, even if the test fails)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import free_port


@contextlib.contextmanager
def own_postgres() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="cp-pg-ingress-"))
    server = EmbeddedPostgres(root / "data", "127.0.0.1", free_port(), durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _children(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # The command may contain spaces or parentheses: the ppid follows the last ")".
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                pids.append(int(entry.name))
    return pids


def server_pids(server: EmbeddedPostgres) -> list[int]:
    """The postmaster (first line of postmaster.pid) and all its children."""
    postmaster = int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])
    return [postmaster, *_children(postmaster)]


@contextlib.contextmanager
def hung(server: EmbeddedPostgres) -> Iterator[None]:
    """Every Postgres process stopped: connections stay open and nothing answers."""
    pids = server_pids(server)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
