"""The dev supervisor (issues 13, 31): a child or a server the stack started itself that
exits is restarted with a doubling backoff and one log line per event, and is down until
it runs again; one that keeps dying young stops the stack. Real child processes
(`connector-push no-such-command` exits 2 at once); the clock is passed in, so the
backoff is asserted without waiting it out."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli.stack.process import ensure_port_free, exit_status, free_port, stop_process
from cli.stack.supervisor import MAX_YOUNG_DEATHS, ChildKeepsFailing, Supervisor


@pytest.mark.slow(seconds=16)
def test_a_child_dying_young_is_restarted_with_backoff_then_stops_the_stack(
    tmp_path: Path,
) -> None:
    supervisor = Supervisor(tmp_path)
    child = supervisor.spawn_cli("broken", ["no-such-command"], {}, now=0.0)
    now, delays = 0.0, []
    try:
        with pytest.raises(ChildKeepsFailing) as stopped:
            for _ in range(MAX_YOUNG_DEATHS):
                assert child.process.wait(timeout=60) == 2
                [line] = supervisor.tend(now)
                assert line.startswith(f"broken exited (exit 2); restart #{child.restarts + 1} in ")
                delays.append(child.restart_at - now if child.restart_at else None)
                assert supervisor.tend(now) == []  # nothing before the backoff is over
                now = child.restart_at or now
                [line] = supervisor.tend(now)
                assert line.startswith(f"broken restarted (restart #{child.restarts}, pid ")
        assert "broken keeps failing at start (exit 2, 5 times in a row)" in str(stopped.value)
    finally:
        supervisor.stop_all(timeout_s=10)
    assert delays == [1.0, 2.0, 4.0, 8.0]


def test_a_child_that_ran_a_while_restarts_after_the_shortest_backoff(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path)
    child = supervisor.spawn_cli("flaky", ["no-such-command"], {}, now=0.0)
    try:
        child.young_deaths = 3  # it had died young before, then ran for 60 s
        assert child.process.wait(timeout=60) == 2
        [line] = supervisor.tend(60.0)
        assert line.startswith("flaky exited (exit 2); restart #1 in 1s")
    finally:
        supervisor.stop_all(timeout_s=10)


class SleeperService:
    """A server the supervisor did not spawn itself (as Postgres and Temporal are): a real
    process that, like them, refuses to start while its port is taken."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def ended(self) -> str | None:
        code = self.process.poll() if self.process is not None else None
        return None if code is None else exit_status(code)

    def start(self) -> None:
        ensure_port_free("127.0.0.1", self.port, "sleeper.port")
        command = [sys.executable, "-c", "import signal; signal.pause()"]  # lives until stopped
        self.process = subprocess.Popen(command, start_new_session=True)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 10)


def test_a_service_is_restarted_like_a_child_and_is_down_until_it_runs(tmp_path: Path) -> None:
    """Issue 31: a server the stack started itself (Postgres, Temporal) that dies is
    restarted like the children, `down()` (what `dev status` shows) says so until it runs
    again, and a restart it cannot make (its port still taken) is retried, not lost."""
    supervisor = Supervisor(tmp_path)
    service = SleeperService(free_port(), tmp_path / "sleeper.log")
    service.start()
    watched = supervisor.watch("sleeper", service, now=0.0)
    holder = socket.socket()
    try:
        assert supervisor.tend(60.0) == [] and supervisor.down() == {}
        first = service.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert service.process is not None and service.process.wait(timeout=60) == -9
        [line] = supervisor.tend(60.0)
        assert line == (
            f"sleeper exited (killed by SIGKILL); restart #1 in 1s; see {service.log_path}"
        )
        assert supervisor.down() == {"sleeper": "killed by SIGKILL"}
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", service.port))
        holder.listen()
        [line] = supervisor.tend(61.0)
        assert line.startswith(f"sleeper did not restart (port 127.0.0.1:{service.port} is busy")
        assert line.endswith("restart #1 in 2s; see " + str(service.log_path))
        assert "is busy" in supervisor.down()["sleeper"]
        assert supervisor.restart_counts() == {"sleeper": 0}
        holder.close()
        assert supervisor.tend(62.0) == []  # still waiting out the backoff
        [line] = supervisor.tend(63.0)
        assert line.startswith("sleeper restarted (restart #1, pid ")
        assert service.pid != first and service.ended() is None
        assert supervisor.down() == {} and supervisor.restart_counts() == {"sleeper": 1}
        assert supervisor.pids() == {"sleeper": service.pid}
        assert watched.young_deaths == 2
    finally:
        holder.close()
        supervisor.stop_all(timeout_s=10)
    assert service.ended() is not None  # stopped with the supervisor
