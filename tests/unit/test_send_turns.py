"""Every request a send step makes takes its turn in its budget's send window (SPEC
NF-8'): a static scan of the send steps (tests/unit/test_one_sender.py proves they are
the only callers of the transport) for a `remote.send(...)` without a `turn`."""

from __future__ import annotations

import ast

from tests.unit.test_one_sender import ROOT, SEND_STEPS


def _calls_without_turn(source: str) -> tuple[int, list[int]]:
    """How many `remote.send(...)` calls, and the lines of those passing no `turn=`."""
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "send"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "remote"
    ]
    missing = [c.lineno for c in calls if not any(k.arg == "turn" for k in c.keywords)]
    return len(calls), missing


def test_every_request_of_the_send_steps_takes_its_window_turn() -> None:
    total = 0
    for name in sorted(SEND_STEPS):
        count, missing = _calls_without_turn((ROOT / name).read_text(encoding="utf-8"))
        assert missing == [], f"{name}: remote.send without turn= at line(s) {missing}"
        total += count
    # POST, locator look-up, PATCH, read-back, an operator's read: none skipped the scan.
    assert total >= 5


def test_the_scan_sees_a_missing_turn() -> None:
    source = "async def f(step):\n    await remote.send(step.http, deadline=1.0)\n"
    assert _calls_without_turn(source) == (1, [2])
    assert _calls_without_turn("await remote.send(h, turn=t)\n") == (1, [])
