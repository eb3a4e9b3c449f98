"""Small process and port helpers shared by the local-stack launchers."""

from __future__ import annotations

import socket
import subprocess


class StackError(RuntimeError):
    """A local-stack problem with a one-line message that names the fix."""


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free right now (for tests and benchmarks)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports: all held open together, so none is handed out twice."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
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
