"""The side-path checks of the chaos campaign on hand-made rows: a zero from a check that
cannot fire would prove nothing (bench/chaos/sampler.py, gate_check.py)."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import yaml

from bench.chaos.checker import Final, classify
from bench.chaos.evidence import Evidence, _patch_owner
from bench.chaos.gate_check import History, _blocks, _patch_refused, history_of
from bench.chaos.sampler import Sampler
from bench.chaos.side_paths import SidePaths
from protocol.drift import Disposition, DriftSurface, Finding
from protocol.send_gate import RequestKind


def _row(kind: str, status: str, n: int) -> dict[str, object]:
    return {"kind": kind, "id": "x", "status": status, "link_key": "lk1_k", "n": n}


def _deleted(before: dict[str, object], after: dict[str, object] | None) -> list[str]:
    sampler = Sampler("unused")
    ident = (str(before["kind"]), "x")
    sampler._last = {ident: before}
    sampler._deleted({} if after is None else {ident: after})
    return [str(v["kind"]) for v in sampler.found()]


def test_an_unfinished_patch_deleted_or_its_journal_shrinking_is_flagged() -> None:
    assert _deleted(_row("patch", "ambiguous_remote_effect", 2), None) == ["evidence_deleted"]
    shrunk = _row("patch", "processing", 1)
    assert _deleted(_row("patch", "processing", 2), shrunk) == ["evidence_deleted"]
    assert _deleted(_row("attempt", "finalized", 1), None) == ["evidence_deleted"]


def test_a_settled_patch_may_be_pruned() -> None:
    assert _deleted(_row("patch", "succeeded", 2), None) == []
    assert _deleted(_row("patch", "pending", 0), _row("patch", "succeeded", 1)) == []


def test_the_recomputed_gate_refuses_what_the_g1_table_refuses() -> None:
    closed = Finding(
        surface=DriftSurface.MAPPING, disposition=Disposition.FAIL_CLOSED, detail="changed"
    )
    upgraded = Finding(
        surface=DriftSurface.PACK_UPGRADED, disposition=Disposition.FROZEN_NO_EFFECT, detail="x"
    )
    assert _blocks(RequestKind.CREATE_FIRST, closed)
    assert not _blocks(RequestKind.CREATE_RESEND, upgraded)
    assert not _blocks(RequestKind.LOOKUP, closed)  # a GET carries no body
    assert _blocks(RequestKind.LOOKUP, upgraded)  # but a new install routes it (C-4)


_T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _patch(pid: str, created_s: float, sends_s: list[float]) -> dict[str, Any]:
    return {
        "patch_id": pid,
        "created_at": _T0 + timedelta(seconds=created_s),
        "send_times": [_T0 + timedelta(seconds=s) for s in sends_s],
    }


def test_a_patch_queued_before_the_one_that_landed_does_not_own_its_ledger_entry() -> None:
    # Seed 99: PATCH b (queued at save time, same body) existed when a's PATCH landed, was
    # then refused by the gate and failed; a, not b, sent what the remote applied.
    a, b = _patch("a", 0, [1.0]), _patch("b", 1.5, [])
    assert (_patch_owner([a, b], _T0 + timedelta(seconds=2)) or {}).get("patch_id") == "a"
    b_sent = _patch("b", 1.5, [3.0])
    assert (_patch_owner([a, b_sent], _T0 + timedelta(seconds=3.5)) or {}).get("patch_id") == "b"
    # With no journalled try before the entry, the newest row then existing is named,
    # so a send the journal missed is still reported against a row.
    owner = _patch_owner([_patch("a", 0, []), b], _T0 + timedelta(seconds=2))
    assert owner is not None and owner["patch_id"] == "b"
    # Seed 99: the PATCH that landed was pruned (settled); the one row left with its body
    # was queued afterwards and cannot have sent it.
    assert _patch_owner([_patch("c", 5, [])], _T0 + timedelta(seconds=2)) is None
    # Seed 513: the row left with its body was queued before the entry, but its every try
    # (all `not_sent`, then refused by the gate) went out after it: a pruned PATCH sent it.
    assert _patch_owner([_patch("d", 0, [2.3, 3.3, 6.0])], _T0 + timedelta(seconds=2)) is None
    # Beside it, a row with no journalled try may be a send its journal lacks: named.
    owner = _patch_owner([_patch("d", 0, [2.3]), _patch("e", 1, [])], _T0 + timedelta(seconds=2))
    assert owner is not None and owner["patch_id"] == "e"


def _history(
    attempts: tuple[dict[str, Any], ...] = (), restores: tuple[dict[str, Any], ...] = ()
) -> History:
    manifest = json.dumps(yaml.safe_load(Path("examples/demo-pack.yaml").read_text()))
    installs = [
        {"id": i, "previous": p, "manifest": manifest, "activated_at": at, "deactivated_at": end}
        for i, p, at, end in (
            ("x", None, _T0, _T0 + timedelta(seconds=100)),
            ("y", "x", _T0 + timedelta(seconds=100), None),
        )
    ]
    link = {"link_key": "k", "created": "x", "action_slot_id": "a", "destination_slot_id": "d"}
    return history_of(installs, [], list(attempts), [], [link], [], list(restores))


def test_c4_counts_every_way_a_link_is_validated_under_an_install() -> None:
    later = _T0 + timedelta(seconds=200)  # only y is active: the link was created under x
    assert "validated under none" in _patch_refused(_history(), "k", later)
    # A supersede's attempt that froze y finalized the link under y.
    attempt = {"attempt_id": "1", "link_key": "k", "status": "succeeded", "pack_install_id": "y"}
    assert _patch_refused(_history(attempts=(attempt,)), "k", later) == ""
    assert "none" in _patch_refused(
        _history(attempts=({**attempt, "status": "terminal_failed"},)), "k", later
    )
    # An operator's revalidate-link (or reconcile) under y, recorded before the PATCH.
    restore = {"link_key": "k", "recorded_at": _T0 + timedelta(seconds=150)}
    assert _patch_refused(_history(restores=(restore,)), "k", later) == ""
    too_late = {"link_key": "k", "recorded_at": later + timedelta(seconds=60)}
    assert "none" in _patch_refused(_history(restores=(too_late,)), "k", later)


def test_a_deferred_create_whose_target_the_crm_cannot_save_is_blocked_not_unsettled() -> None:
    # Seed 99: a company's create waits (LANE-2) on its primary contact, whose save G-2
    # refuses (the record is owned under the second contact slot): by design it waits.
    attempt = {
        "attempt_id": "1",
        "link_key": "company",
        "attempt_ordinal": 1,
        "status": "pending",
        "request_idempotency_key": None,
        "locator": None,
        "body_hash": None,
    }
    ev = Evidence(ledger=[], attempts=[attempt], links={}, patches=[], records={}, objects={})
    target = {"company": "contact"}.get
    assert classify(ev, target)["company"].state is Final.UNSETTLED
    refused = {"contact": "prior_ownership_uncertain"}
    verdict = classify(ev, target, refused)["company"]
    assert verdict.state is Final.BLOCKED and "prior_ownership_uncertain" in verdict.detail


async def test_no_episode_starts_after_the_chaos_phase() -> None:
    """Seed 513: a slot removal begun after the phase's end ran past the sampler's last
    look, so the link it restored under the removed slot was never seen (sampler.py)."""
    side = SidePaths(cast(Any, None), cast(Any, None), random.Random(1))
    started: list[float] = []

    async def step() -> None:
        started.append(asyncio.get_running_loop().time())

    until = asyncio.get_running_loop().time() + 0.05
    await side._every(until, (0.1, 0.1), step)
    assert started == []


async def test_the_sampler_stops_between_samples() -> None:
    """Seed 311's first run: the sampler cancelled mid-query left asyncpg refusing its own
    rollback, and the campaign crashed; `stop` lets the sample in progress finish."""
    sampler = Sampler("postgresql://nobody@127.0.0.1:9/none")  # every sample fails: OSError
    running = asyncio.create_task(sampler.run())
    sampler.stop()
    await asyncio.wait_for(running, 15)
    assert sampler.samples == 0 and sampler.found() == []
