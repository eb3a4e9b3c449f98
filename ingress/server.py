"""Serve the ingress with uvicorn: the one place a process reads its settings.

uvicorn bounds an idle keep-alive connection (`timeout_keep_alive`), but not the
time to receive a request head: its keep-alive timer is cancelled by the first
byte, and a new connection has no timer at all, so a client that stalls halfway
through its headers holds the connection for ever (slowloris). Nor does its own
connection limit (`limit_concurrency`) answer as an endpoint must: a plain-text
503 without Retry-After, on ack_drop endpoints too (ING-2). `BoundedProtocol` is
uvicorn's own httptools protocol plus both bounds: a head timer, armed when a
connection opens and when a request's first byte arrives, disarmed when the head
is complete (when it fires the connection is closed); and, once the head is in,
a count of the open connections, marking a request beyond `max_connections` for
the app to answer at once (ingress/app.py). uvicorn's limit stays, further out,
as a backstop.

Nor does httptools bound a head's size (SPEC S-6): every header is kept as it arrives,
so 5 MB of small headers cost the process over 100 MB. `BoundedProtocol` counts the
request line and the headers (and the bytes of a head still arriving) and, past
`max_header_bytes` or `max_headers`, answers `431` at once, drops the rest of the
head unparsed, and closes when the client does or the head timer fires.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar, Final, NoReturn

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ingress.admission import check_database_url
from ingress.app import create_app
from ingress.config import BREAK_GLASS_ENV, ConfigError, IngressSettings, load_config
from ingress.errors import OVER_CAPACITY_EXTENSION
from protocol.ingress_policy import IngressPolicy
from services.log_format import install as install_logs

# Set in the extra processes `serve` starts (to the starting process's pid), so they
# serve and start no others, and end with the process that started them.
CHILD_ENV: Final = "CONNECTOR_PUSH_INGRESS_CHILD"
logger = logging.getLogger(__name__)
_PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h
STOP_TIMEOUT_S: Final = 10.0
UVICORN_LIMIT_FACTOR: Final = 2
HEAD_TOO_LARGE: Final = b'{"error":"request_header_fields_too_large"}'


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head over its bound (S-6)."""


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose head stalls, refusing a
    head over its size or header count (431), and marking a request that arrives with
    more than `max_connections` connections open."""

    head_timeout_s: ClassVar[float] = 2.0
    max_connections: ClassVar[int] = 1_000
    max_header_bytes: ClassVar[int] = 32_768
    max_headers: ClassVar[int] = 100
    _head_timer: asyncio.TimerHandle | None = None
    _in_head = False  # a request has begun and its headers are not all in
    _head_bytes = 0  # its request line and header names and values so far
    _head_chunks = 0  # the bytes of reads that fell wholly inside it
    _head_count = 0
    _head_refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._head_refused:
            return  # the rest of a refused head is dropped unparsed until the close
        inside = self._in_head
        super().data_received(data)
        # httptools holds a header until it is whole: a read that began and ended inside
        # one head is all head, so one huge header is bounded too.
        if inside and self._in_head and not self._head_refused:
            self._head_chunks += len(data)
            if self._head_chunks > self.max_header_bytes:
                self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_chunks, self._head_count = True, 0, 0, 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value), 1)
        super().on_header(name, value)

    def _count(self, size: int, headers: int) -> None:
        self._head_bytes += size
        self._head_count += headers
        if self._head_bytes > self.max_header_bytes or self._head_count > self.max_headers:
            self._head_refused = True
            raise _HeadTooLarge  # httptools stops here; uvicorn then answers a bad request

    def send_400_response(self, msg: str) -> None:
        if self._head_refused:  # the bad request is ours: a head over its bound
            self._answer_431()
            return
        super().send_400_response(msg)

    def _refuse_head(self) -> None:
        self._head_refused = True
        self._answer_431()

    def _answer_431(self) -> None:
        """431 with `Connection: close`, then half-close: the client reads the answer
        before anything it is still sending could reset the connection; the head timer
        closes it if the client does not."""
        logger.warning(
            "request head refused (431): over %d bytes or %d headers",
            self.max_header_bytes,
            self.max_headers,
        )
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[431],
                    b"content-type: application/json\r\n",
                    b"content-length: %d\r\n" % len(HEAD_TOO_LARGE),
                    b"connection: close\r\n\r\n",
                    HEAD_TOO_LARGE,
                ]
            )
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        # This connection is among those counted; tasks still running count too (a
        # request whose connection closed under it), as in uvicorn's own limit.
        if len(self.connections) > self.max_connections or len(self.tasks) >= self.max_connections:
            self.scope.setdefault("extensions", {})[OVER_CAPACITY_EXTENSION] = {}
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_for(policy: IngressPolicy) -> type[BoundedProtocol]:
    """The protocol class with the policy's head timeout and connection bound."""
    return type(
        "PolicyBoundedProtocol",
        (BoundedProtocol,),
        {
            "head_timeout_s": policy.head_timeout_ms / 1000,
            "max_connections": policy.max_connections,
            "max_header_bytes": policy.max_header_bytes,
            "max_headers": policy.max_headers,
        },
    )


def uvicorn_config(app: Any, policy: IngressPolicy, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for the ingress: the policy's head and connection bounds.

    uvicorn's own limit (answering past it without the app) is only a backstop: our
    answer covers up to `UVICORN_LIMIT_FACTOR` times `max_connections` connections, each
    closed once answered, and a head still arriving is closed by the head timeout."""
    return uvicorn.Config(
        app,
        http=protocol_for(policy),
        limit_concurrency=policy.max_connections * UVICORN_LIMIT_FACTOR,
        log_level="warning",
        log_config=None,  # uvicorn's lines go through the process's one handler (JSON)
        access_log=False,
        **options,
    )


def bind(host: str, port: int, *, shared: bool) -> socket.socket:
    """The listening socket; `shared` (SO_REUSEPORT) lets several processes bind one port,
    the kernel spreading connections over them."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _start_siblings(
    config_path: Path, count: int, break_glass: bool
) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, CHILD_ENV: str(os.getpid())}
    if break_glass:  # given on the command line: the extra processes load the same policy
        env[BREAK_GLASS_ENV] = "1"
    command = [sys.executable, "-m", "ingress", str(config_path)]
    return [subprocess.Popen(command, env=env) for _ in range(count)]


def serve(config_path: Path | None = None, settings: IngressSettings | None = None) -> None:
    """Load settings and policy once, then serve until interrupted (with
    `CONNECTOR_PUSH_INGRESS_PROCESSES` > 1, that many processes share the port)."""
    settings = settings or IngressSettings()
    path = config_path or settings.config
    if path is None:
        raise ConfigError("no ingress policy: pass --config or set CONNECTOR_PUSH_INGRESS_CONFIG")
    config = load_config(path, break_glass_ack_drop=settings.break_glass_ack_drop)
    install_logs(json_lines=settings.log_json, level=settings.log_level)
    warn_break_glass(config.policy)
    warn_production_exceptions(config.policy)
    check_database_url(settings.database_url.get_secret_value())
    app = create_app(
        config, settings.database_url.get_secret_value(), temporal=settings.temporal_target()
    )
    parent = os.environ.get(CHILD_ENV)
    if parent is not None:
        _end_with(int(parent))
    shared = parent is not None or settings.processes > 1
    sock = bind(settings.host, settings.port, shared=shared)
    siblings = (
        []
        if parent is not None
        else _start_siblings(path, settings.processes - 1, settings.break_glass_ack_drop)
    )
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_after_graceful_shutdown)
    try:
        uvicorn.Server(uvicorn_config(app, config.policy)).run(sockets=[sock])
    finally:
        for sibling in siblings:
            _stop(sibling)
        sock.close()


def warn_break_glass(policy: IngressPolicy) -> None:
    """ING-2': production endpoints dropping events is an incident action; say so loudly,
    in every process, for as long as it serves."""
    dropping = policy.break_glass_ack_drop
    if dropping:
        logger.warning(
            "BREAK-GLASS ack-drop in production (ING-2'): %s answer 204 and drop the event on "
            "an internal failure; restart without --break-glass-ack-drop / %s when the "
            "incident is over",
            ", ".join(sorted(dropping)),
            BREAK_GLASS_ENV,
        )


def warn_production_exceptions(policy: IngressPolicy) -> None:
    """S-3: each exception a production policy makes (a legacy signature scheme, plain
    HTTP) is logged by every process, for as long as it serves."""
    for allowance in sorted(policy.production_exceptions):
        logger.warning(
            "production profile allows %s (production_allows in the ingress policy)",
            allowance.value,
        )


def _exit_after_graceful_shutdown(signum: int, frame: FrameType | None) -> NoReturn:
    """uvicorn shuts down gracefully on SIGTERM and then raises the signal again for the
    handler it found. SIGTERM's default action would end the process right there, before
    `serve` stops the processes it started: they would go on serving the shared port,
    with the old policy, after the ingress was stopped. Exit as SIGTERM would, but
    through `serve`'s cleanup."""
    del frame
    raise SystemExit(128 + signum)


def _end_with(parent: int) -> None:
    """An extra process gets SIGTERM (a graceful stop) when the process that started it
    dies, even by SIGKILL (Linux's parent-death signal); if that already happened, exit."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        raise SystemExit(0)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (uvicorn shuts down gracefully on it), then SIGKILL if it lingers."""
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
