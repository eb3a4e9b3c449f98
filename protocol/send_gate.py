"""The one send gate (SPEC §17 G-1, widening C-5; C-2', C-4, DRIFT-2).

Rules kept in this module:
1. Every request a link's workflow sends to a remote is decided here, at send time,
   from what the request froze and the configuration as it is now; the caller runs
   `decide` in the transaction that claims or checkpoints the request and sends
   nothing on a refusal.
2. What is checked depends on the request kind (the G-1 table, `RequestKind`):
   a create checks the drift matrix's attempt column (the active install, C-4,
   included: no active install is an owner finding); a re-send also the key's age
   (G-5); a GET the surfaces that change where the request goes or who sends it;
   a PATCH, first try and every re-send alike (C-2'), the finalized-link column,
   the source record and the current authority for the fields it carries.
3. A refusal names what the caller does (`Refusal`), and nothing else: which state
   that is for this row (terminal or ambiguous) the journal decides, with
   `protocol.recovery` (a refusal never forgets a try that may have landed).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from protocol.active import ActiveMetadata
from protocol.authority import PermissionFacts
from protocol.drift import (
    INSTALL_SURFACES,
    Disposition,
    DriftSurface,
    Finding,
    classify,
    suspend_reason,
)
from protocol.errors import RejectReason
from protocol.snapshots import AttemptSnapshot, LinkSnapshot, Snapshot


class RequestKind(StrEnum):
    """The rows of the G-1 table."""

    CREATE_FIRST = "create_first"  # a create POST that no earlier try can have landed
    CREATE_RESEND = "create_resend"  # replay-safe re-send, or the re-send after a locator miss
    LOOKUP = "lookup"  # the GET of a create's unique locator
    READBACK = "readback"  # the GET of a PATCHed object
    PATCH = "patch"  # a PATCH, first try and every re-send (C-2')


class Refusal(StrEnum):
    """What the caller does instead of sending."""

    FAIL_CLOSED = (
        "fail_closed"  # a create: the attempt leaves the dispatch (matrix, attempt column)
    )
    PARK = "park"  # the row parks for an operator (ambiguous_remote_effect)
    SUSPEND_LINK = "suspend_link"  # a PATCH fails and the link is suspended (DRIFT-2)
    FAIL_PATCH = "fail_patch"  # a PATCH fails; the link stays as it is (a later save re-plans)


# G-1, the GETs: the drift surfaces that change where a request goes or who sends it.
ROUTE_SURFACES: Final = INSTALL_SURFACES | {
    DriftSurface.OWNER_IDENTITY,
    DriftSurface.PROFILE_REPLACED,
    DriftSurface.ENDPOINT,
    DriftSurface.CREDENTIAL_REF,
    DriftSurface.CREDENTIAL_GENERATION,
    DriftSurface.REMOTE_SCOPE,
}


# The stored reason of a re-send refused because the remote may have forgotten its key.
KEY_EXPIRED: Final = "key_expired"


class KeyAge(Snapshot):
    """G-5's hook: how old the create's idempotency key is (counted from its first try's
    send) and how long the frozen profile says the remote honours it; None: unknown, not
    checked."""

    age_seconds: float | None = None
    retention_seconds: float | None = None

    @property
    def lapsed(self) -> bool:
        if self.age_seconds is None or self.retention_seconds is None:
            return False
        return self.age_seconds > self.retention_seconds


class SourceNow(Snapshot):
    """A PATCH's source record and its saver's authority, as they are now."""

    exists: bool
    deleted: bool = False
    permissions: PermissionFacts | None
    # The source fields the frozen body was built from; empty for a first try, whose
    # body is built under the current authority right after the gate passed.
    fields_sent: frozenset[str] = frozenset()


class GateInput(Snapshot):
    kind: RequestKind
    frozen: LinkSnapshot | AttemptSnapshot  # the link (PATCH, read-back) or the attempt
    active: ActiveMetadata | None  # None: the owner has no active install
    source: SourceNow | None = None  # PATCH only
    key_age: KeyAge = KeyAge()  # create re-send only


class Go(Snapshot):
    """The request may leave; `findings` (none failing closed) are recorded."""

    kind: RequestKind
    findings: tuple[Finding, ...] = ()


class Refused(Snapshot):
    """Nothing is sent. `reason` is the stored reason (`drift:<surface>` for drift, else a
    `RejectReason` value), `detail` what the operator reads."""

    kind: RequestKind
    refusal: Refusal
    reason: str
    detail: str
    findings: tuple[Finding, ...] = ()


Decision = Go | Refused

_ON_DRIFT: Final = {
    RequestKind.CREATE_FIRST: Refusal.FAIL_CLOSED,
    RequestKind.CREATE_RESEND: Refusal.PARK,
    RequestKind.LOOKUP: Refusal.PARK,
    RequestKind.READBACK: Refusal.PARK,
    RequestKind.PATCH: Refusal.SUSPEND_LINK,
}


def decide(gate: GateInput) -> Decision:
    """May this request go now (G-1)? Pure: the caller loaded every fact."""
    findings = tuple(classify(gate.frozen, _active_for(gate)))
    blocking = tuple(f for f in findings if _blocks(gate.kind, f))
    if blocking:
        return _drift_refusal(gate.kind, findings, blocking)
    if gate.kind is RequestKind.CREATE_RESEND and gate.key_age.lapsed:
        detail = (
            f"the idempotency key is {gate.key_age.age_seconds:.0f} s old, past the"
            f" {gate.key_age.retention_seconds:.0f} s the remote keeps it (G-5)"
        )
        return Refused(kind=gate.kind, refusal=Refusal.PARK, reason=KEY_EXPIRED, detail=detail)
    if gate.kind is RequestKind.PATCH:
        assert gate.source is not None, "a PATCH is gated with its source record"
        refused = _source_refusal(gate.source)
        if refused is not None:
            reason, detail = refused
            return Refused(
                kind=gate.kind,
                refusal=Refusal.FAIL_PATCH,
                reason=reason.value,
                detail=f"{reason.value}: {detail}",
                findings=findings,
            )
    return Go(kind=gate.kind, findings=findings)


def _active_for(gate: GateInput) -> ActiveMetadata | None:
    """The finalized-link column reads the saver's readable fields too (FLS row)."""
    if gate.active is None or gate.source is None or gate.source.permissions is None:
        return gate.active
    readable = gate.source.permissions.readable_fields
    return gate.active.model_copy(update={"readable_fields": readable})


def _blocks(kind: RequestKind, finding: Finding) -> bool:
    if kind in (RequestKind.LOOKUP, RequestKind.READBACK):
        # A GET carries no frozen body: only where it goes and who sends it matter, and
        # a new install (C-4) is one of those whatever the column says of a re-send.
        if finding.surface not in ROUTE_SURFACES:
            return False
        return finding.surface in INSTALL_SURFACES or finding.disposition is Disposition.FAIL_CLOSED
    return finding.disposition is Disposition.FAIL_CLOSED


def _drift_refusal(
    kind: RequestKind, findings: tuple[Finding, ...], blocking: tuple[Finding, ...]
) -> Refused:
    detail = "; ".join(f"{f.surface.value}: {f.detail}" for f in blocking)
    if kind is RequestKind.PATCH:
        reason = suspend_reason(findings)
    else:
        reason = suspend_reason(blocking) if blocking else RejectReason.DRIFT_FAIL_CLOSED.value
    return Refused(
        kind=kind,
        refusal=_ON_DRIFT[kind],
        reason=reason,
        detail=f"drift before {_WHAT[kind]}: {detail}",
        findings=findings,
    )


_WHAT: Final = {
    RequestKind.CREATE_FIRST: "POST",
    RequestKind.CREATE_RESEND: "POST",
    RequestKind.LOOKUP: "locator lookup",
    RequestKind.READBACK: "read-back",
    RequestKind.PATCH: "PATCH",
}


def _source_refusal(source: SourceNow) -> tuple[RejectReason, str] | None:
    """PATCH-1 at send time: the record exists and its saver may still read what is sent."""
    if not source.exists:
        reason = RejectReason.SOURCE_DELETED if source.deleted else RejectReason.SOURCE_NOT_FOUND
        return reason, "the source record is gone"
    facts = source.permissions
    if facts is None:
        return RejectReason.NO_AUTHORITY, "no saver authority for the record"
    if not facts.object_readable or not facts.record_readable:
        return RejectReason.RECORD_UNREADABLE, "the saver can no longer read the record"
    unreadable = sorted(source.fields_sent - facts.readable_fields)
    if unreadable:
        return RejectReason.FIELD_UNREADABLE, f"the saver can no longer read {unreadable}"
    return None
