"""Run every shell command in README.md and docs/*.md, so the docs cannot rot (issue 31).

The fenced ```sh / ```bash / ```shell / ```console blocks are cut into commands (a
command ends where its line does not end in `\\` and its quotes are closed). Each command
is either run, in order, by bash against a fresh `connector-push dev` stack
(tests/e2e/test_dev_stack.py runs them on the stack whose life it follows), or named in
`ALLOWLIST` with the reason it cannot run inside a test. A command that is neither fails
the run, so a new doc command is run from the day it is written.

A command succeeds with exit 0, or with the code its line documents as `# exit N`.
Templates with placeholders belong in a ```text fence; a fence with no language is
refused, so a shell block cannot slip past by leaving its language out.

`connector-push` runs in the test's own process: bash's `connector-push` is a function
that hands its arguments, environment and working directory to a tiny client, which
asks the test to run the same typer app through `CliRunner` and prints what it printed,
exiting with its exit code. The same command with the same input, without a 3-second
interpreter start per line on a shared 2-core machine.

README.md runs first (its tour starts the story), then `ORDER`, then any other docs/*.md
in name order; one bash per file, so a file's shell variables carry from block to block.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socketserver
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from cli.main import app
from cli.stack.devconfig import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
# Files whose examples build on the state an earlier file left (links, a parked link).
ORDER = ("operating.md", "save-api.md", "packs.md", "deployment.md", "testing-and-benchmarks.md")
SHELL = {"sh", "bash", "shell", "console"}
NOT_SHELL = {"text", "json", "yaml", "python", "sql", "http", "toml", "ini"}

# Command prefix -> why it cannot run inside a test. Keep it short: every entry must
# still match a documented command (test_every_allowlist_entry_is_still_used).
ALLOWLIST: dict[str, str] = {
    "make dev": "starts the stack this test starts itself (`connector-push dev`)",
    "make test": "the whole suite, which runs this test",
    "make check": "the server-free part of `make test`, which runs this test's parser",
    "make chaos": "a 10-minute fault campaign; tests/e2e/test_chaos.py runs a short seeded one",
    "CHAOS_SEED=": "the fault campaign again (`make chaos`), with other settings",
    "source .venv/bin/activate": "the test puts .venv/bin on PATH itself",
}

EXIT = re.compile(r"(?:^|\s)#\s*exit\s+(\d+)\b")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str
    expected_exit: int

    def allowlisted(self) -> str | None:
        flat = " ".join(self.text.split())
        return next((p for p in ALLOWLIST if _starts_with_words(flat, p)), None)


def _starts_with_words(text: str, prefix: str) -> bool:
    """`make dev` covers `make dev --x`, not `make devx`; `NAME=` covers `NAME=7 …`."""
    return text == prefix or text.startswith(prefix if prefix.endswith("=") else prefix + " ")


def doc_files() -> list[Path]:
    present = sorted(DOCS.glob("*.md"))
    ordered = [DOCS / name for name in ORDER if (DOCS / name) in present]
    return [README, *ordered, *(p for p in present if p not in ordered)]


def _balanced(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return not text.rstrip().endswith("\\")


def cut_commands(lines: list[str], first_line: int, name: str, console: bool) -> list[Command]:
    found: list[Command] = []
    pending: list[str] = []
    start_at = first_line
    for offset, raw in enumerate(lines):
        line = raw
        if console and not pending:
            if not line.startswith("$ "):
                continue  # a console block's output
            line = line[2:]
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start_at = first_line + offset
        pending.append(line)
        text = "\n".join(pending)
        if _balanced(text):
            code = EXIT.search(text)
            found.append(Command(f"{name}:{start_at}", text, int(code[1]) if code else 0))
            pending = []
    assert not pending, f"{name}:{start_at}: unterminated command {pending!r}"
    return found


def doc_commands(path: Path) -> list[Command]:
    """Every command of the file's shell fences, in order; refuses a fence without a language."""
    name = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else path.name
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Command] = []
    index = 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if opened is None:
            index += 1
            continue
        lang = opened[1].lower()
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        assert lang, f"{name}:{index + 1}: a fence needs a language (```bash, or ```text)"
        assert lang in SHELL | NOT_SHELL, f"{name}:{index + 1}: unknown fence language {lang!r}"
        if lang in SHELL:
            body = lines[index + 1 : end]
            found += cut_commands(body, index + 2, name, console=lang == "console")
        index = end + 1
    return found


def script(commands: list[Command]) -> str:
    """One bash script: each command, then a check of its exit code."""
    parts = [
        # `dev env` / `dev status` name this test's stack, not the developer's.
        'connector-push() { if [ "$1" = dev ]; then set -- "$@" --config "$DOCS_DEV_CONFIG"; fi; '
        '"$DOCS_BRIDGE_PYTHON" -S -E "$DOCS_BRIDGE_CLIENT" "$@"; }'
    ]
    for command in commands:
        where = shlex.quote(command.where)
        parts += [
            f"printf '\\n>>> %s %s\\n' {where} \"$(date +%T)\"",
            command.text,
            "__rc=$?",
            f'[ "$__rc" -eq {command.expected_exit} ] || {{ printf '
            f"'%s exited %s, expected {command.expected_exit}\\n' {where} \"$__rc\" >&2; "
            "exit 97; }",
        ]
    return "\n".join(parts) + "\n"


BRIDGE_CLIENT = """\
import json, os, socket, sys
conn = socket.socket(socket.AF_UNIX)
conn.connect(os.environ["DOCS_BRIDGE"])
request = {"args": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}
conn.sendall(json.dumps(request).encode() + b"\\n")
data = b""
while chunk := conn.recv(65536):
    data += chunk
reply = json.loads(data)
sys.stdout.write(reply["stdout"])
sys.stdout.flush()
sys.stderr.write(reply["stderr"])
sys.exit(reply["code"])
"""


def run_cli(request: dict[str, Any]) -> dict[str, Any]:
    """One `connector-push` command, with the caller's exact environment and directory."""
    wanted: dict[str, str] = request["env"]
    env = {name: wanted.get(name) for name in {*os.environ, *wanted}}
    previous = os.getcwd()
    os.chdir(request["cwd"])
    try:
        result = CliRunner().invoke(app, request["args"], env=env)
    finally:
        os.chdir(previous)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return {"stdout": result.stdout, "stderr": stderr, "code": result.exit_code}


class _Bridge(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        reply = run_cli(json.loads(self.rfile.readline()))
        self.wfile.write(json.dumps(reply).encode())


def run_every_doc(root: Path, config: Path) -> None:
    """Every documented command, in order, against the running dev stack `config` names;
    `root` is laid out like a checkout (`examples/` beside the stack's `.dev-data/`)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE"}
    }
    env["PATH"] = f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["DOCS_DEV_CONFIG"] = str(config)
    (root / "bridge.py").write_text(BRIDGE_CLIENT)
    env.update(
        DOCS_BRIDGE=str(root / "cli.sock"),
        DOCS_BRIDGE_CLIENT=str(root / "bridge.py"),
        DOCS_BRIDGE_PYTHON=sys.executable,
    )
    server = socketserver.UnixStreamServer(env["DOCS_BRIDGE"], _Bridge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _run_every_doc(root, config, env)
    finally:
        server.shutdown()
        server.server_close()


def _run_every_doc(root: Path, config: Path, env: dict[str, str]) -> None:
    dev_env = ["dev", "env", "--json", "--config", str(config)]
    exports = run_cli({"args": dev_env, "env": env, "cwd": str(root)})
    assert exports["code"] == 0, exports["stderr"]
    info = json.loads(exports["stdout"])
    # A reader of docs/ has run the README's `eval "$(connector-push dev env)"` already.
    env.update(
        DATABASE_URL=info["database_url"],
        TEMPORAL_ADDRESS=info["temporal_address"],
        TEMPORAL_NAMESPACE=info["temporal_namespace"],
        SANDBOX_URL=info["sandbox_url"],
        INGRESS_URL=info["ingress_url"],
    )
    ran = 0
    for path in doc_files():
        runnable = [c for c in doc_commands(path) if c.allowlisted() is None]
        if not runnable:
            continue
        log = root / f"{path.stem}.log"
        with log.open("w") as out:
            code = subprocess.run(
                ["bash", "-c", script(runnable)],
                cwd=root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=600,
                check=False,
            ).returncode
        assert code == 0, f"{path.name}:\n{log.read_text()[-6000:]}"
        ran += len(runnable)
    assert ran >= 10
