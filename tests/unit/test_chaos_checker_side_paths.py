"""The side-path checks of the chaos campaign on hand-made rows: a zero from a check that
cannot fire would prove nothing (bench/chaos/sampler.py, gate_check.py)."""

from __future__ import annotations

from bench.chaos.gate_check import _blocks
from bench.chaos.sampler import Sampler
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
