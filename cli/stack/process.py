"""Small process and port helpers shared by the local-stack launchers."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
from typing import Final


class StackError(RuntimeError):
    """A local-stack problem with a one-line message that names the fix."""


def exit_status(code: int) -> str:
    """`exit 3`, or `killed by SIGKILL` for a negative Popen return code."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def ensure_port_free(host: str, port: int, setting: str) -> None:
    """Raise `StackError` naming the `temporal-dev.yaml` setting when the port is taken."""
    if not port_is_free(host, port):
        raise StackError(
            f"port {host}:{port} is busy: stop what is using it or change `{setting}` "
            "in temporal-dev.yaml"
        )


# Where test and benchmark ports are picked: below the kernel's ephemeral range (Linux
# 32768-60999, macOS 49152-65535), from which every outgoing connection takes its source
# port. A port picked there and released for a moment (picked, then bound by a child; or a
# stack stopped and started again on the same ports, as the dev-stack tests and the chaos
# campaign do) could be taken meanwhile by any process's `connect()`; seen as a Temporal
# server that would not start while a second test process ran beside it.
PICK_RANGE: Final = range(20000, 32768)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free right now (for tests and benchmarks)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports from `PICK_RANGE`, in random order: all held open
    together, so none is handed out twice."""
    held: list[socket.socket] = []
    try:
        for port in random.sample(PICK_RANGE, len(PICK_RANGE)):
            if len(held) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        if len(held) < count:
            raise StackError(
                f"only {len(held)} of {count} ports free on {host} in "
                f"{PICK_RANGE.start}-{PICK_RANGE.stop - 1}"
            )
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def stop_process(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM and wait; SIGKILL what does not exit in time. A no-op if it already exited."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
