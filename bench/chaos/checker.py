"""The campaign's verdict, from the sandbox ledger, SQL and the operator's visibility query only.

Checks (issue 10 deliverable 8, SPEC §0, NF-4, JRN-2, POST-4):
1. at most one remote object created per link key over the whole run, supersedes included;
2. every accepted save ends finalized, or parked and listed by
   `NeedsOperator = true AND ExecutionStatus = "Running"`; every rejection names a reason;
3. no effect-possible attempt or PATCH ends terminal_failed/failed, whatever a later try
   answered, and none is superseded (SPEC §15 C-1, C-2: a definite 4xx after a try that
   may have landed proves nothing); evidence of a send is never cleared;
4. every finalized link's object exists, was created for that link, and is mirrored;
5. no link is suspended remote_conflict unless someone else wrote to its object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from temporalio.client import Client

from bench.chaos.evidence import Evidence
from protocol.identity import link_workflow_id

# Each violation kind, the rule it breaks.
RULES = {
    "duplicate_create": "SPEC §0, NF-4: one local record owns at most one remote object",
    "unattributed_create": "a ledger create no attempt sent (key, locator and body unknown)",
    "unsettled": "still in flight after the settle phase (nothing may hang)",
    "parked_not_listed": "WF-4, REC-3: parked work is listed by the operator's query",
    "accepted_save_lost": "WF-2: an accepted save's admission stands",
    "rejected_without_reason": "NF-2: a rejection names its reason",
    "send_evidence_cleared": "JRN-2: once a try may have left, remote_io_started_at stays set",
    "effect_possible_terminal": "C-1, C-2, JRN-2, REC-4: effect possible ends ambiguous, "
    "never terminal_failed or failed, whatever a later try answered",
    "supersede_after_effect": "C-1: supersede is refused for an attempt that may have landed",
    "finalized_object_missing": "POST-2: a finalized link's remote object exists",
    "finalized_on_foreign_object": "POST-2: a link's remote id is an object its attempts created",
    "mirror_mismatch": "POST-2: the record's mirror holds the link's remote id",
    "false_remote_conflict": "PROF-2: a 412 on our own re-sent PATCH is read back, not a conflict",
    # The side paths' invariants (gate_check.py, sampler.py).
    "sent_past_fail_closed": "G-1, C-4, C-5, G-5: no request is sent that the gate, "
    "recomputed from the pack history and the journal, refuses",
    "two_creators_one_destination": "G-2: one record owns at most one remote object per remote "
    "destination across action slots not declared separate",
    "evidence_deleted": "G-3: no attempt row, unfinished PATCH or journal row of either "
    "is ever deleted",
    "parked_without_exit": "G-6, C-9: a parked link's remedy names an action the guards accept",
    "finalized_under_missing_slot": "C-9, G-4: no link is finalized under a slot the active "
    "pack lacks",
}
PARKED_QUERY = 'NeedsOperator = true AND ExecutionStatus = "Running"'
PARKED_ATTEMPT = {"ambiguous_remote_effect", "terminal_failed"}
IN_FLIGHT_PATCH = {"pending", "processing"}
PARKED_PATCH = {"ambiguous_remote_effect", "failed"}


class Final(StrEnum):
    FINALIZED = "finalized"
    PARKED = "parked"
    BLOCKED = "blocked"  # a deferred create waiting on a target that is itself parked
    UNSETTLED = "unsettled"
    ABSENT = "absent"


@dataclass(frozen=True)
class Verdict:
    state: Final
    detail: str


@dataclass(frozen=True)
class SaveOutcome:
    """One save as the campaign reported it: `kind` is the decision, or `error`."""

    link_key: str
    via: str  # "cli" or "api"
    kind: str
    reason: str | None = None

    @property
    def accepted(self) -> bool:
        return self.kind not in ("rejected", "error")


async def listed_parked(client: Client) -> set[str]:
    """Workflow ids an operator finds with the UI's parked-links query."""
    return {wf.id async for wf in client.list_workflows(PARKED_QUERY)}


def _latest_link_state(link: dict[str, Any], patches: list[dict[str, Any]]) -> Verdict:
    if link["status"] == "suspended_drift":
        return Verdict(Final.PARKED, f"link suspended ({link['suspend_reason']})")
    if link["status"] != "finalized":
        return Verdict(Final.FINALIZED, f"link {link['status']}")
    last = patches[-1] if patches else None
    if last is None or last["status"] in ("succeeded", "superseded"):
        return Verdict(Final.FINALIZED, "link finalized")
    if last["status"] in IN_FLIGHT_PATCH:
        return Verdict(Final.UNSETTLED, f"PATCH still {last['status']}")
    return Verdict(Final.PARKED, f"PATCH {last['status']}: {last['last_error']}")


def classify(
    ev: Evidence,
    dependency: Callable[[str], str | None],
    refused: Mapping[str, str] | None = None,
) -> dict[str, Verdict]:
    """Each link key's end state; `dependency` names a create's association target key,
    `refused` the reason the CRM's last save of a key was rejected (for a target that was
    never admitted: a deferred create then waits for it by design, LANE-2)."""
    refused = refused or {}
    attempts, patches = ev.attempts_by_key(), ev.patches_by_key()
    verdicts: dict[str, Verdict] = {}
    for key in sorted(set(attempts) | set(ev.links)):
        latest = attempts[key][-1] if attempts.get(key) else None
        link = ev.links.get(key)
        if latest is None or latest["status"] == "finalized":
            verdicts[key] = (
                _latest_link_state(link, patches.get(key, []))
                if link
                else Verdict(Final.UNSETTLED, "attempt finalized without a link")
            )
        elif latest["status"] in PARKED_ATTEMPT:
            verdicts[key] = Verdict(
                Final.PARKED,
                f"attempt #{latest['attempt_ordinal']} {latest['status']}: {latest['last_error']}",
            )
        else:
            verdicts[key] = Verdict(
                Final.UNSETTLED, f"attempt #{latest['attempt_ordinal']} {latest['status']}"
            )
    for key, verdict in verdicts.items():
        target = dependency(key)
        waiting = verdict.state is Final.UNSETTLED and "pending" in verdict.detail
        if (
            waiting
            and target
            and verdicts.get(target, Verdict(Final.ABSENT, "")).state
            in (
                Final.PARKED,
                Final.BLOCKED,
            )
        ):
            verdicts[key] = Verdict(Final.BLOCKED, f"{verdict.detail}; target {target} parked")
        elif waiting and target and target not in verdicts and target in refused:
            verdicts[key] = Verdict(
                Final.BLOCKED,
                f"{verdict.detail}; target {target} never admitted ({refused[target]})",
            )
    return verdicts


def violation(kind: str, link_key: str | None, detail: str, **extra: object) -> dict[str, object]:
    return {"kind": kind, "link_key": link_key, "detail": detail, **extra}


def settled(verdicts: dict[str, Verdict], listed: set[str]) -> bool:
    """Nothing in flight, and every parked link is where an operator looks."""
    return all(
        v.state is not Final.UNSETTLED
        and (v.state is not Final.PARKED or link_workflow_id(k) in listed)
        for k, v in verdicts.items()
    )


def check(
    ev: Evidence,
    verdicts: dict[str, Verdict],
    listed: set[str],
    saves: Iterable[SaveOutcome],
) -> list[dict[str, object]]:
    """Every violation of the campaign's invariants (empty when the run was clean)."""
    return [
        *_duplicates(ev),
        *_end_states(verdicts, listed, list(saves)),
        *_attempt_evidence(ev),
        *_patch_evidence(ev),
        *_finalized_links(ev),
        *_false_conflicts(ev),
    ]


def _duplicates(ev: Evidence) -> Iterable[dict[str, object]]:
    for key in sorted({a["link_key"] for a in ev.attempts}):
        created = ev.created_objects(key)
        if len(created) > 1:
            ordinals = sorted(
                (int(a["attempt_ordinal"]), a["status"], a["last_error"])
                for a in ev.attempts
                if a["link_key"] == key
            )
            yield violation(
                "duplicate_create",
                key,
                f"{len(created)} remote objects created for one link key: {sorted(created)}",
                attempts=[list(o) for o in ordinals],
            )
    for entry in ev.unattributed:
        yield violation(
            "unattributed_create",
            None,
            f"ledger create seq {entry.seq} ({entry.object_type} {entry.object_id}) matches no "
            "attempt's idempotency key, locator or frozen body",
        )


def _end_states(
    verdicts: dict[str, Verdict], listed: set[str], saves: list[SaveOutcome]
) -> Iterable[dict[str, object]]:
    for key, verdict in sorted(verdicts.items()):
        if verdict.state is Final.UNSETTLED:
            yield violation("unsettled", key, verdict.detail)
        elif verdict.state is Final.PARKED and link_workflow_id(key) not in listed:
            yield violation(
                "parked_not_listed",
                key,
                f"{verdict.detail}; not found by {PARKED_QUERY}",
            )
    accepted = {s.link_key for s in saves if s.accepted}
    for key in sorted(accepted - set(verdicts)):
        yield violation("accepted_save_lost", key, "a save was accepted but no row exists")
    for save in saves:
        if save.kind == "rejected" and not save.reason:
            yield violation("rejected_without_reason", save.link_key, f"via {save.via}")


def _attempt_evidence(ev: Evidence) -> Iterable[dict[str, object]]:
    for a in ev.attempts:
        landed = ev.creates_of.get(a["attempt_id"], [])
        key, ordinal = a["link_key"], a["attempt_ordinal"]
        if landed and not a["started"]:
            yield violation(
                "send_evidence_cleared",
                key,
                f"attempt #{ordinal} ({a['status']}) has remote_io_started_at NULL although the "
                f"ledger holds its create (seq {landed[0].seq}, object {landed[0].object_id})",
            )
        # Effect possible: the ledger holds its create, or a journalled try may have landed
        # (a checkpoint stays set after tries that provably never left, JRN-2).
        # A definite rejection of a later try does not undo an earlier one (C-1).
        possible = a["journal_possible"] or bool(landed)
        if possible and a["status"] in ("terminal_failed", "superseded"):
            kind = (
                "supersede_after_effect"
                if a["status"] == "superseded"
                else ("effect_possible_terminal")
            )
            yield violation(
                kind,
                key,
                f"attempt #{ordinal} {a['status']} after a try that may have landed "
                f"(response {a['response_snapshot']}, last_error {a['last_error']!r}); "
                f"ledger creates: {[e.object_id for e in landed]}",
            )


def _patch_evidence(ev: Evidence) -> Iterable[dict[str, object]]:
    for p in ev.patches:
        landed = ev.patch_entries_of.get(p["patch_id"], [])
        if landed and not p["started"]:
            yield violation(
                "send_evidence_cleared",
                p["link_key"],
                f"PATCH {p['patch_id']} ({p['status']}) has remote_io_started_at NULL although "
                f"the ledger holds it (seq {landed[0].seq})",
            )
        # The ledger also records PATCHes the remote refused (a 412): only applied ones
        # are an effect. A PATCH that may have landed is never sent again (C-2), so it
        # never ends failed, whatever a later answer said.
        applied = [e for e in landed if 200 <= e.status < 300]
        possible = p["journal_possible"] or bool(applied)
        if possible and p["status"] == "failed":
            yield violation(
                "effect_possible_terminal",
                p["link_key"],
                f"PATCH {p['patch_id']} failed after a try that may have landed "
                f"(response {p['response_snapshot']}, last_error {p['last_error']!r})",
            )


def _finalized_links(ev: Evidence) -> Iterable[dict[str, object]]:
    for key, link in sorted(ev.links.items()):
        if link["status"] != "finalized":
            continue
        remote_id = link["remote_id"]
        if remote_id not in ev.objects.get(link["target_object"], set()):
            yield violation(
                "finalized_object_missing", key, f"{link['target_object']} {remote_id!r} absent"
            )
        elif remote_id not in ev.created_objects(key):
            yield violation(
                "finalized_on_foreign_object",
                key,
                f"remote id {remote_id!r} was not created by any attempt of this link",
            )
        fields = ev.records.get((link["source_object"], link["source_record_id"]), {})
        mirrored = fields.get(link["mirror_remote_id_field"])
        if link["mirror_remote_id_field"] and mirrored != remote_id:
            yield violation(
                "mirror_mismatch",
                key,
                f"record {link['source_record_id']} {link['mirror_remote_id_field']}="
                f"{mirrored!r}, link remote id {remote_id!r}",
            )


def _false_conflicts(ev: Evidence) -> Iterable[dict[str, object]]:
    # The campaign never writes to the remote out of band: only another writer's PATCH
    # (one not traced to this link's own PATCH rows) can justify a conflict.
    for key, link in sorted(ev.links.items()):
        reason = link["suspend_reason"] or ""
        conflict = link["status"] == "suspended_drift" and "remote_conflict" in reason
        if conflict and not ev.foreign_patches.get(key):
            yield violation(
                "false_remote_conflict",
                key,
                f"suspended {reason!r} but every write to {link['remote_id']} was its own",
            )
