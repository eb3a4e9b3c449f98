"""A fork server for the CLI tests: each command runs as its own process, forked from one
that has already imported everything (issue 31: make test's CPU budget).

`python -m cli …` spent most of its CPU importing, building typer's command tree and
tearing the interpreter down; the tests ran it a few hundred times (~3.5 s of CPU each on
a loaded 2-core machine: 300 s of the suite). Here one process per test worker imports
the CLI and every layer behind it once and builds the tree, then forks a child per
request. The child is a real process, as before: its own stdio files, environment,
working directory, argv, signal dispositions and exit status. What it does not repeat:
- the imports: a module that read the environment at import time would read the
  server's, and nothing in the product does (settings are read when a command runs);
- typer's tree: built from the same `app`, once;
- the interpreter's module teardown: the child waits for its non-daemon threads, runs
  the atexit handlers (logging's flush among them), flushes stdio and leaves with
  `os._exit`. A crash *in* that teardown is what tests/e2e/test_operator_exits.py looks
  for, and it still starts real `python -m cli` processes.

Protocol, over a Unix socket, one connection per command: the client sends one JSON line
`{"args", "env", "cwd", "stdout", "stderr"}` (the two are file paths), the server answers
`{"pid": …}` at once and `{"returncode": …}` when the child ends (negative: the signal
that killed it, as `subprocess` reports it). Started by `tests/cli_process.py`.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import pkgutil
import runpy
import select
import socket
import sys
import threading
import traceback

PRELOAD: tuple[str, ...] = ("cli", "protocol", "db", "services", "activities", "workflows")
PRELOAD += ("worker", "ingress", "sandbox", "connector_push_client")


def preload() -> None:
    """Import every module a command may import in its body."""
    for name in PRELOAD:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)


def build_command_tree_once() -> None:
    """typer rebuilds the click tree from every command's signature on each `app()` call
    (0.3 s of CPU); a `connector-push` process calls it once, so the children reuse the
    tree the server built from the same `app`."""
    import typer.main

    from cli.main import app

    built = typer.main.get_command(app)
    build = typer.main.get_command

    def get_command(typer_instance: typer.Typer) -> object:
        return built if typer_instance is app else build(typer_instance)

    typer.main.get_command = get_command  # type: ignore[assignment]


def exit_code(exc: SystemExit) -> int:
    """The status `python` itself would exit with for this SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def become_command(request: dict[str, object]) -> int:
    """In the forked child: take the request's stdio, directory, environment and argv,
    then run `python -m cli` as the interpreter would; its exit status."""
    stdin = os.open(os.devnull, os.O_RDONLY)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    stdout = os.open(str(request["stdout"]), flags, 0o600)
    stderr = os.open(str(request["stderr"]), flags, 0o600)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(str(request["cwd"]))
    env = request["env"]
    args = request["args"]
    assert isinstance(env, dict) and isinstance(args, list)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-m", *args]
    try:
        runpy.run_module("cli", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exit_code(exc)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def leave(code: int) -> None:
    """End the child as the interpreter would, less its module teardown (see above)."""
    try:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                code = code or 120  # what the interpreter exits with when it cannot flush
    finally:
        os._exit(code)


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener], [], [], 0.02)
        if readable:
            conn, _ = listener.accept()
            request = json.loads(conn.makefile("rb").readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for inherited in (listener, conn, *waiting.values()):
                    inherited.close()
                leave(become_command(request))
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            try:
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
                conn.sendall(b"\n")
            except OSError:
                pass  # the client gave up (its timeout); the child is gone all the same
            conn.close()


if __name__ == "__main__":
    preload()
    build_command_tree_once()
    serve(sys.argv[1])
