"""The one send gate's table (SPEC §17 G-1, C-4, C-5, C-2'): each request kind, the checks
its row names and the outcome of a refusal, on the pure decision."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.active import ActiveMetadata, resolve_active
from protocol.authority import PermissionFacts
from protocol.send_gate import (
    GateInput,
    Go,
    KeyAge,
    Refusal,
    Refused,
    RequestKind,
    SourceNow,
    decide,
)
from tests.unit.factories import (
    CONTACT_FIELDS,
    INSTALL,
    contact_active,
    contact_attempt,
    contact_link,
    demo_manifest,
)

K = RequestKind
CREATES = (K.CREATE_FIRST, K.CREATE_RESEND)
GETS_FROM_ATTEMPT, GETS_FROM_LINK = (K.LOOKUP,), (K.READBACK,)


def _profile(**values: object) -> Any:
    return lambda d: d["profiles"][0].update(values)


def _mapping(d: dict[str, Any]) -> None:
    d["actionSlots"][0]["mappings"].append({"sourceField": "Title", "remoteProperty": "jobtitle"})


def upgraded(edit: Any = None) -> ActiveMetadata:
    """A new install of the same lineage (C-4), with `edit` applied to the pack."""
    return resolve_active(
        demo_manifest(edit), "install-2", "push-contact", install_ancestors=frozenset({INSTALL})
    )


def readable(fields: frozenset[str] = CONTACT_FIELDS) -> PermissionFacts:
    return PermissionFacts(object_readable=True, record_readable=True, readable_fields=fields)


def source(**kw: Any) -> SourceNow:
    values: dict[str, Any] = {"exists": True, "permissions": readable()}
    return SourceNow(**(values | kw))


def gate(kind: RequestKind, active: ActiveMetadata | None, **kw: Any) -> GateInput:
    frozen = contact_attempt() if kind in (*CREATES, K.LOOKUP) else contact_link()
    if kind is K.PATCH:
        kw.setdefault("source", source())
    return GateInput(kind=kind, frozen=frozen, active=active, **kw)


@pytest.mark.parametrize("kind", list(K))
def test_nothing_changed_every_request_goes(kind: RequestKind) -> None:
    assert isinstance(decide(gate(kind, contact_active())), Go)


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [
        (K.CREATE_FIRST, Refusal.FAIL_CLOSED),
        (K.CREATE_RESEND, Refusal.PARK),
        (K.LOOKUP, Refusal.PARK),
        (K.READBACK, Refusal.PARK),
        (K.PATCH, Refusal.SUSPEND_LINK),
    ],
)
def test_no_active_install_refuses_every_request(kind: RequestKind, refusal: Refusal) -> None:
    """C-4: an owner with no active install sends nothing, whatever the request."""
    decision = decide(gate(kind, None))
    assert isinstance(decision, Refused) and decision.refusal is refusal


@pytest.mark.parametrize("kind", list(K))
def test_an_endpoint_change_refuses_every_request(kind: RequestKind) -> None:
    """Drift row "endpoint class or binding": fail closed in both columns, and a surface
    that changes where a GET goes."""
    decision = decide(gate(kind, contact_active(demo_manifest(_profile(endpointClass="v2")))))
    assert isinstance(decision, Refused), decision
    assert "endpoint" in decision.detail


def test_a_new_install_refuses_a_patch_and_the_gets_but_not_a_frozen_create() -> None:
    """C-4: a new install fails a finalized link closed (no PATCH until revalidated) and
    stops a GET; an active attempt retries only its frozen request (matrix: frozen)."""
    for kind in (K.PATCH, K.READBACK, K.LOOKUP):
        decision = decide(gate(kind, upgraded()))
        assert isinstance(decision, Refused), kind
    patch = decide(gate(K.PATCH, upgraded()))
    assert isinstance(patch, Refused) and patch.reason == "drift:pack_upgraded"
    for kind in CREATES:
        assert isinstance(decide(gate(kind, upgraded())), Go), kind


def test_a_patch_suspends_for_the_most_specific_surface() -> None:
    """Issue 49's reproduction: a new install whose mapping changed: `drift:mapping`."""
    decision = decide(gate(K.PATCH, upgraded(_mapping)))
    assert isinstance(decision, Refused)
    assert (decision.refusal, decision.reason) == (Refusal.SUSPEND_LINK, "drift:mapping")


def test_a_mapping_change_is_frozen_for_a_create() -> None:
    """The attempt column: the frozen body goes (C-5, frozen_no_effect)."""
    assert isinstance(decide(gate(K.CREATE_RESEND, upgraded(_mapping))), Go)


@pytest.mark.parametrize(
    ("now", "reason"),
    [
        ({"exists": False, "deleted": True}, "source_deleted"),
        ({"exists": False}, "source_not_found"),
        ({"permissions": None}, "no_authority"),
        (
            {
                "permissions": PermissionFacts(
                    object_readable=True, record_readable=False, readable_fields=CONTACT_FIELDS
                )
            },
            "record_unreadable",
        ),
        (
            {
                "permissions": readable(CONTACT_FIELDS - {"FirstName"}),
                "fields_sent": frozenset({"Email", "FirstName"}),
            },
            "field_unreadable",
        ),
    ],
)
def test_a_patch_checks_its_source_and_the_authority_for_what_it_sends(
    now: dict[str, Any], reason: str
) -> None:
    """G-1's PATCH row, first try and re-send alike (C-2'): the PATCH fails, the link as
    it is (no matrix row fails closed)."""
    decision = decide(gate(K.PATCH, contact_active(), source=source(**now)))
    assert isinstance(decision, Refused), decision
    assert (decision.refusal, decision.reason) == (Refusal.FAIL_PATCH, reason)


def test_fields_the_saver_still_reads_go() -> None:
    now = source(permissions=readable(CONTACT_FIELDS - {"Phone"}), fields_sent={"Email"})
    assert isinstance(decide(gate(K.PATCH, contact_active(), source=now)), Go)


def test_a_replay_safe_resend_past_the_keys_retention_parks() -> None:
    """G-5's hook: a key the remote may have forgotten makes a re-send unsafe."""
    lapsed = KeyAge(age_seconds=90_000, retention_seconds=86_400)
    decision = decide(gate(K.CREATE_RESEND, contact_active(), key_age=lapsed))
    assert isinstance(decision, Refused) and decision.refusal is Refusal.PARK
    fresh = KeyAge(age_seconds=60, retention_seconds=86_400)
    assert isinstance(decide(gate(K.CREATE_RESEND, contact_active(), key_age=fresh)), Go)
    unknown = KeyAge(age_seconds=90_000)
    assert isinstance(decide(gate(K.CREATE_RESEND, contact_active(), key_age=unknown)), Go)
    # A first try's key is new: its age is never a reason.
    assert isinstance(decide(gate(K.CREATE_FIRST, contact_active(), key_age=lapsed)), Go)


def test_a_get_ignores_what_only_a_body_carries() -> None:
    """A GET carries no frozen body: a mapping change alone does not stop a read of the
    object (only the install that came with it does)."""
    same_install = contact_active(demo_manifest(_mapping))
    assert isinstance(decide(gate(K.LOOKUP, same_install)), Go)
    assert isinstance(decide(gate(K.READBACK, same_install)), Go)
    assert isinstance(decide(gate(K.PATCH, same_install)), Refused)
