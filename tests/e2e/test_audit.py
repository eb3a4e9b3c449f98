"""SPEC OPS-2 through the operator CLI: every accepted action is on the link and in the trail.

(Append-only triggers and the bulk/pack entries: tests/db/test_audit.py.)
"""

from __future__ import annotations

import json
from typing import Any

from sandbox.faults import FaultRuleSpec
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.support import eventually
from tests.e2e.test_operator import WHO, _ambiguous_company, _cli, _json, cli_env  # noqa: F401


async def _trail(stack: Stack, key: str) -> list[dict[str, Any]]:
    rows = await stack.pool.fetch(
        "SELECT * FROM connector_operator_audit WHERE link_key = $1 ORDER BY audit_id", key
    )
    return [dict(r) for r in rows]


async def test_reconcile_stamps_the_link_and_appends_one_entry_with_before_and_after(
    stack: Stack,
    cli_env: dict[str, str],  # noqa: F811
    db_dsn: str,
) -> None:
    key = await _ambiguous_company(stack)
    [entry] = await stack.sandbox.ledger(object_type="companies", kind="create")
    assert entry.object_id is not None
    args = ["reconcile", key, "--remote-id", entry.object_id, "--evidence", "ledger", *WHO]
    _json(await _cli(cli_env, *args, "--json"))
    link = await eventually(lambda: stack.link(key), lambda r: r is not None)
    # Issue 14 item 3: the link's operator columns too, not only the attempt's.
    assert (link["last_operator"], link["last_operator_reason"]) == (
        "ops@example.com",
        "incident 42",
    )
    _json(await _cli(cli_env, *args, "--json"))  # a re-run: the same update, no second entry
    [row] = await _trail(stack, key)
    assert (row["operator"], row["reason"], row["command"]) == (
        "ops@example.com",
        "incident 42",
        "reconcile",
    )
    before, after = json.loads(row["state_before"]), json.loads(row["state_after"])
    assert before["attempt_status"] == "ambiguous_remote_effect" and before["link_status"] is None
    assert after["link_status"] == "finalized" and after["remote_id"] == entry.object_id
    assert json.loads(row["arguments"]) == {"remote_id": entry.object_id, "evidence": "ledger"}
    listed = await _cli(cli_env, "audit", "--link-key", key, "--json", "--database-url", db_dsn)
    assert listed.exit_code == 0, listed.output  # JSON Lines: one entry a line
    assert [json.loads(line)["command"] for line in listed.stdout.splitlines()] == ["reconcile"]


async def test_a_refused_action_appends_nothing(
    stack: Stack,
    cli_env: dict[str, str],  # noqa: F811
) -> None:
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/contacts", action="status", status=422)
    )
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "terminal_failed")
    refused = await _cli(cli_env, "mark-terminal", key, *WHO)
    assert refused.exit_code == 1 and "does not apply" in refused.output
    assert await _trail(stack, key) == []
    await stack.sandbox.clear_faults()
    accepted = await _cli(cli_env, "supersede", key, *WHO)
    assert accepted.exit_code == 0, accepted.output
    [row] = await _trail(stack, key)
    assert row["command"] == "supersede" and json.loads(row["arguments"])["reserve_next"] is True
