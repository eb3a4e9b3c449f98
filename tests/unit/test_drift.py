"""DRIFT-1/3: one row per drift-matrix surface x {finalized link, active attempt}."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import AttemptSummary, CreateReserved, DeferredAssociationReserved
from protocol.drift import Disposition, DriftSurface, classify, suspend_reason
from protocol.gates import decide_admission
from protocol.states import AttemptStatus
from tests.unit.factories import (
    CONTACT_FIELDS,
    INSTALL,
    contact_active,
    contact_attempt,
    contact_context,
    contact_link,
    demo_manifest,
)

S, D = DriftSurface, Disposition
Doc = dict[str, Any]
Edit = Callable[[Doc], None]


def slot(**values: object) -> Edit:
    return lambda d: d["actionSlots"][0].update(values)


def profile(**values: object) -> Edit:
    return lambda d: d["profiles"][0].update(values)


def destination(**values: object) -> Edit:
    return lambda d: d["destinationSlots"][0].update(values)


def rename_profile(d: Doc) -> None:
    d["profiles"][0]["name"] = "sandbox-renamed"
    d["destinationSlots"][0]["profile"] = "sandbox-renamed"


def new_destination_slot(d: Doc) -> None:
    d["destinationSlots"][0]["id"] = "remote-contacts-v2"
    d["actionSlots"][0]["destinationSlot"] = "remote-contacts-v2"


def recreate_action(d: Doc) -> None:
    d["actionSlots"][0]["id"] = "push-contact-v2"
    d["actionSlots"][1]["associations"][0]["targetActionSlot"] = "push-contact-v2"


def add_mapping(d: Doc) -> None:
    d["actionSlots"][0]["mappings"].append({"sourceField": "Title", "remoteProperty": "jobtitle"})


def active_for(edit: Edit | None, **kw: Any) -> ActiveMetadata:
    return contact_active(demo_manifest(edit), **kw)


def owner_changed() -> ActiveMetadata:
    return active_for(lambda d: d.update(connectorOwnerKey="other-owner"))


def fls_changed() -> ActiveMetadata:
    return active_for(None).model_copy(update={"readable_fields": CONTACT_FIELDS - {"Phone"}})


# (surface, active metadata builder, expected link disposition, expected attempt disposition)
ROWS: list[tuple[DriftSurface, Callable[[], ActiveMetadata], Disposition, Disposition]] = [
    (S.FLOW_VERSION, lambda: active_for(slot(flowVersion="2")), D.BENIGN, D.FROZEN_NO_EFFECT),
    (
        S.ACTION_RENAMED,
        lambda: active_for(slot(flowActionName="Push_Person")),
        D.BENIGN,
        D.FROZEN_NO_EFFECT,
    ),
    (
        S.ACTION_RECREATED,
        # A link is validated against its *stored* destination slot id.
        lambda: resolve_active(
            demo_manifest(recreate_action), INSTALL, "push-contact", "remote-contacts"
        ),
        D.FAIL_CLOSED,
        D.FAIL_CLOSED,
    ),
    (
        S.NAMESPACE_RENAMED,
        lambda: active_for(lambda d: d.update(namespace="demo2")),
        D.BENIGN,
        D.FROZEN_NO_EFFECT,
    ),
    (S.OWNER_IDENTITY, owner_changed, D.FAIL_CLOSED, D.FAIL_CLOSED),
    (
        # A reinstall: the frozen install is not an ancestor of the active one.
        S.PACK_INSTALL,
        lambda: active_for(None, install="install-2"),
        D.FAIL_CLOSED,
        D.FAIL_CLOSED,
    ),
    (
        # P-10, D-06L, C-4: an upgrade on the same install lineage is a new install: the
        # link fails closed until revalidated; an attempt retries its frozen request.
        S.PACK_UPGRADED,
        lambda: active_for(None, install="install-2").model_copy(
            update={"install_ancestors": frozenset({INSTALL})}
        ),
        D.FAIL_CLOSED,
        D.FROZEN_NO_EFFECT,
    ),
    (S.PROFILE_RENAMED, lambda: active_for(rename_profile), D.BENIGN, D.FROZEN_NO_EFFECT),
    (
        S.CREDENTIAL_REF,
        lambda: active_for(profile(credentialRef="env:NEW")),
        D.FAIL_CLOSED,
        D.FAIL_CLOSED,
    ),
    (
        S.ENDPOINT,
        lambda: active_for(profile(endpointClass="objects-v2")),
        D.FAIL_CLOSED,
        D.FAIL_CLOSED,
    ),
    (
        S.CREDENTIAL_GENERATION,
        lambda: active_for(profile(credentialGeneration="2")),
        D.FAIL_CLOSED,
        D.FAIL_CLOSED,
    ),
    (
        S.RETRY_POLICY,
        lambda: active_for(profile(retryPolicy={"maxAttempts": 9, "initialIntervalMs": 100})),
        D.BENIGN,
        D.FROZEN_NO_EFFECT,
    ),
    (S.MAPPING, lambda: active_for(add_mapping), D.FAIL_CLOSED, D.FROZEN_NO_EFFECT),
    (S.SOURCE_AUTHORITY, fls_changed, D.BENIGN, D.FROZEN_NO_EFFECT),
    (
        S.CREATE_PATH,
        lambda: active_for(slot(createPath="/crm/v4/objects/{target}")),
        D.BENIGN,
        D.FROZEN_NO_EFFECT,
    ),
    (
        S.UPDATE_PATH,
        lambda: active_for(slot(updatePath="/crm/v4/objects/{target}/{remoteId}")),
        D.FAIL_CLOSED,
        D.BENIGN,
    ),
    (
        S.RESPONSE_ID_PATH,
        lambda: active_for(slot(responseIdPath="$.results[0].id")),
        D.BENIGN,
        D.FROZEN_NO_EFFECT,
    ),
    (
        S.MIRROR_FIELDS,
        lambda: active_for(slot(mirror={"remoteIdField": "hs_id__c", "provenanceField": "p"})),
        D.MIRROR_BLOCKED,
        D.FROZEN_NO_EFFECT,
    ),
    (
        S.TARGET_RENAMED,
        lambda: active_for(destination(targetObject="people")),
        D.FAIL_CLOSED,
        D.FAIL_CLOSED,
    ),
    (
        S.REMOTE_SCOPE,
        lambda: active_for(destination(remoteScope="other-portal")),
        D.FAIL_CLOSED,
        D.FAIL_CLOSED,
    ),
    (
        S.IDEMPOTENCY_SUPPORT,
        lambda: active_for(profile(idempotency={"patchReplaySafe": True})),
        D.BENIGN,
        D.FROZEN_NO_EFFECT,
    ),
    (
        S.PROFILE_PAYLOAD,
        lambda: active_for(profile(precondition={"header": "If-Match"})),
        D.FAIL_CLOSED,
        D.FROZEN_NO_EFFECT,
    ),
]


@pytest.mark.parametrize(
    ("surface", "build", "link_expected", "attempt_expected"),
    [pytest.param(*row, id=row[0].value) for row in ROWS],
)
def test_single_surface_drift(
    surface: DriftSurface,
    build: Callable[[], ActiveMetadata],
    link_expected: Disposition,
    attempt_expected: Disposition,
) -> None:
    active = build()
    link_findings = classify(contact_link(), active)
    attempt_findings = classify(contact_attempt(), active)
    assert [(f.surface, f.disposition) for f in link_findings] == [(surface, link_expected)]
    assert [(f.surface, f.disposition) for f in attempt_findings] == [(surface, attempt_expected)]


def test_destination_slot_replaced_covers_profile_and_target_rows() -> None:
    active = contact_active(demo_manifest(new_destination_slot))
    # Validating the stored destination: the old slot (and its profile) is gone and
    # the action now points elsewhere.
    stored = active.model_copy(
        update={"destination_slot_id": "remote-contacts", "destination": None, "profile": None}
    )
    link = {(f.surface, f.disposition) for f in classify(contact_link(), stored)}
    attempt = {(f.surface, f.disposition) for f in classify(contact_attempt(), stored)}
    assert link == {(S.TARGET_NEW_SLOT, D.FAIL_CLOSED), (S.PROFILE_REPLACED, D.FAIL_CLOSED)}
    assert attempt == {
        (S.TARGET_NEW_SLOT, D.FAIL_CLOSED),
        (S.PROFILE_REPLACED, D.FAIL_CLOSED),
    }


def test_a_base_url_change_names_the_binding_and_the_suspension_names_the_surface() -> None:
    """Issue 14 item 7: not `objects-api -> objects-api`, and `drift:endpoint`, not `drift`."""
    before = demo_manifest().profiles[0].base_url
    findings = classify(contact_link(), active_for(profile(baseUrl="https://eu.example.test")))
    assert [(f.surface, f.detail) for f in findings] == [
        (S.ENDPOINT, f"base URL {before} -> https://eu.example.test")
    ]
    assert suspend_reason(findings) == "drift:endpoint"
    classed = classify(contact_link(), active_for(profile(endpointClass="objects-v2")))
    assert classed[0].detail == "endpoint class objects-api -> objects-v2"


def test_the_suspend_reason_is_the_first_fail_closed_surface() -> None:
    findings = classify(contact_link(), active_for(add_mapping))
    assert suspend_reason(findings) == "drift:mapping"
    assert suspend_reason(classify(contact_link(), owner_changed())) == "drift:owner_identity"


def test_no_drift_no_findings() -> None:
    assert classify(contact_link(), contact_active()) == []
    assert classify(contact_attempt(), contact_active()) == []


def test_missing_owner_pack_fails_closed() -> None:
    findings = classify(contact_link(), None)
    assert [(f.surface, f.disposition) for f in findings] == [(S.OWNER_IDENTITY, D.FAIL_CLOSED)]


def test_declared_credential_rotation_is_benign_for_links() -> None:
    rotating = profile(credentialRotationSameDestination=True)
    base = contact_active(demo_manifest(rotating))
    link = classify(contact_link(), base)  # frozen snapshot lacks the declaration
    assert link and link[0].surface is S.PROFILE_PAYLOAD
    frozen = contact_link().model_copy(
        update={
            "profile": contact_link().profile.model_copy(
                update={"credential_rotation_same_destination": True}
            )
        }
    )
    both = profile(credentialRotationSameDestination=True, credentialGeneration="2")
    findings = classify(frozen, contact_active(demo_manifest(both)))
    assert [(f.surface, f.disposition) for f in findings] == [(S.CREDENTIAL_GENERATION, D.BENIGN)]


def test_update_path_rendering_to_the_same_route_is_benign() -> None:
    same = active_for(slot(updatePath="/crm/v3/objects/contacts/{remoteId}"))
    findings = classify(contact_link(), same)
    assert [(f.surface, f.disposition) for f in findings] == [(S.UPDATE_PATH, D.BENIGN)]


@pytest.mark.parametrize(
    "build",
    [
        lambda: active_for(slot(createPath="/crm/v4/objects/{target}")),
        lambda: active_for(destination(targetObject="people")),
        lambda: active_for(rename_profile),
        lambda: active_for(profile(credentialRef="env:NEW")),
    ],
)
@pytest.mark.parametrize(
    "status",
    [AttemptStatus.PENDING, AttemptStatus.AMBIGUOUS_REMOTE_EFFECT, AttemptStatus.WRITEBACK_PENDING],
)
def test_changed_path_target_or_profile_never_reserves_second_attempt(
    build: Callable[[], ActiveMetadata], status: AttemptStatus
) -> None:
    attempts = (AttemptSummary(attempt_id="att-1", status=status),)
    decision = decide_admission(contact_context(active=build(), attempts=attempts))
    assert not isinstance(decision, CreateReserved | DeferredAssociationReserved)
