"""Only the send step behind the gate sends to a remote (SPEC §17 G-1).

A static scan of every runtime module: a module that imports the transport
(`services.remote`) or makes an HTTP request (an httpx verb on a client, `httpx.<verb>`,
`httpx.Request`) must be one of the two send steps, the transport itself, or an
exception named here with its reason. A new module that sends, however it sends,
fails this test until it goes through the gate or is named as an exception.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
RUNTIME: Final = (
    "activities",
    "cli",
    "db",
    "ingress",
    "protocol",
    "services",
    "worker",
    "workflows",
)

# The gate's send step: each request leaves here only after `protocol.send_gate.decide`
# passed in the transaction that claimed or checkpointed it.
SEND_STEPS: Final = frozenset({"services/create/send.py", "services/patch/send.py"})
# The transport the send steps call (the wire, the deadline, the answer's bounds).
TRANSPORT: Final = "services/remote.py"
# The two exceptions G-1 names: they send to no CRM remote.
EXCEPTIONS: Final = {
    # Workflow-action completion callbacks: their own client, the target resolved from
    # the ingress configuration by endpoint name (S-2), never a CRM record's remote.
    "services/action_callback.py": "workflow-action completion callbacks",
    # `pack verify` (throw-away objects on a test account), when it is written.
    "services/pack_verify.py": "pack verify",
    "cli/pack_verify.py": "pack verify",
}
# Requests to the dev stack's own processes (the Temporal UI, the ingress's metrics, a
# health probe of a local port): no remote at all.
LOCAL_PROCESSES: Final = {
    "cli/stack/dev_cmd.py": "waits for the dev stack's own ports",
    "cli/stack/temporal.py": "waits for the local Temporal UI",
    "cli/status_cmd.py": "reads the local ingress's /metrics",
}

HTTP_VERBS: Final = frozenset(
    {"request", "get", "post", "put", "patch", "delete", "head", "options", "send", "stream"}
)
HTTPX_BUILDERS: Final = HTTP_VERBS | {"Request", "build_request"}


def _name_of(node: ast.expr) -> str:
    """The last identifier of a call's receiver (`step.http` -> `http`)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _imports_transport(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name == "services.remote" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        if node.module == "services.remote":
            return True
        return node.module == "services" and any(a.name == "remote" for a in node.names)
    return False


def _sends(node: ast.AST) -> bool:
    """An HTTP request made or built here: `<client>.<verb>(...)` on a receiver named like
    an HTTP client, `remote.send(...)`, or `httpx.<verb>(...)` / `httpx.Request(...)`."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    verb, receiver = node.func.attr, _name_of(node.func.value)
    if receiver == "httpx":
        return verb in HTTPX_BUILDERS
    if receiver == "remote":
        return verb == "send"
    lowered = receiver.lower()
    return verb in HTTP_VERBS and ("http" in lowered or "client" in lowered)


def senders(source: str) -> tuple[bool, list[int]]:
    """Whether a module imports the transport, and the lines where it sends."""
    tree = ast.parse(source)
    imports = any(_imports_transport(node) for node in ast.walk(tree))
    lines = sorted(node.lineno for node in ast.walk(tree) if _sends(node))  # type: ignore[attr-defined]
    return imports, lines


def _modules() -> list[Path]:
    return sorted(p for top in RUNTIME for p in (ROOT / top).rglob("*.py"))


def test_only_the_gates_send_step_sends_to_a_remote() -> None:
    allowed_to_send = SEND_STEPS | {TRANSPORT} | EXCEPTIONS.keys() | LOCAL_PROCESSES.keys()
    offenders: list[str] = []
    for path in _modules():
        name = path.relative_to(ROOT).as_posix()
        imports, lines = senders(path.read_text(encoding="utf-8"))
        if imports and name not in SEND_STEPS:
            offenders.append(f"{name}: imports the transport (services.remote)")
        if lines and name not in allowed_to_send:
            offenders.append(f"{name}: sends HTTP at line(s) {lines}")
    assert offenders == [], (
        "only the send step behind the gate (services/create/send.py, services/patch/send.py)"
        " may send to a remote (SPEC §17 G-1):\n" + "\n".join(offenders)
    )


def test_the_send_steps_are_where_requests_leave() -> None:
    """The scan is not vacuous: each send step calls the transport, and only it."""
    for name in sorted(SEND_STEPS):
        imports, lines = senders((ROOT / name).read_text(encoding="utf-8"))
        assert imports and lines, name
    imports, lines = senders((ROOT / TRANSPORT).read_text(encoding="utf-8"))
    assert lines, "the transport writes the request"


def test_the_scan_catches_each_way_of_sending() -> None:
    """A module that skips the gate is caught, whichever way it sends."""
    assert senders("from services import remote\n") == (True, [])
    assert senders("import services.remote\n")[0]
    assert senders("from services.remote import send\n")[0]
    assert senders("async def f(step):\n    await remote.send(step.http)\n")[1] == [2]
    assert senders("async def f(step):\n    await step.http.request('GET', 'u')\n")[1] == [2]
    assert senders("async def f(self):\n    await self._client.post('u')\n")[1] == [2]
    assert senders("import httpx\nhttpx.get('u')\n")[1] == [2]
    assert senders("import httpx\nhttpx.Request('GET', 'u')\n")[1] == [2]
    # Not requests: a dict's get, a Temporal client's handle.
    assert senders("d = {}\nd.get('k')\nclient.get_workflow_handle('w')\n") == (False, [])
