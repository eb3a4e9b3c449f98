"""LANE-2/LANE-3 decisions: the deferred create is completed only from its frozen vector."""

from __future__ import annotations

from protocol.active import resolve_active
from protocol.admission import AssociationTarget
from protocol.deferred import Waiting, complete_deferred, deferred_target_keys
from protocol.identity import link_key
from protocol.request import FreezeFailure, freeze_create_request
from protocol.snapshots import ActionConfigSnapshot, CreateRequestSnapshot
from protocol.states import LinkStatus
from tests.unit.factories import INSTALL, demo_manifest

MANIFEST = demo_manifest()
ACTIVE = resolve_active(MANIFEST, INSTALL, "push-company")
FROZEN = ActionConfigSnapshot.of(ACTIVE.require()[0])


def deferred_request() -> CreateRequestSnapshot:
    action, destination, profile = ACTIVE.require()
    request = freeze_create_request(
        action=action,
        destination=destination,
        profile=profile,
        properties={"name": "Engines"},
        idempotency_key="k-1",
        locator_value=None,
        pending_associations=("primary-contact",),
    )
    assert isinstance(request, CreateRequestSnapshot)
    return request


def test_target_key_comes_from_the_frozen_vector() -> None:
    keys = deferred_target_keys(ACTIVE, FROZEN, ("c-001",), ("primary-contact",))
    expected = link_key("demo-owner", "push-contact", "Contact", "c-001", "remote-contacts")
    assert keys == {"primary-contact": expected}


def test_misaligned_vector_fails_closed() -> None:
    result = deferred_target_keys(ACTIVE, FROZEN, (), ("primary-contact",))
    assert isinstance(result, FreezeFailure) and "aligned" in result.detail


def test_changed_contracts_fail_closed() -> None:
    changed = FROZEN.model_copy(update={"mapping_fingerprint": "other"})
    result = deferred_target_keys(ACTIVE, changed, ("c-001",), ("primary-contact",))
    assert isinstance(result, FreezeFailure) and "changed" in result.detail


def test_unfinalized_target_waits() -> None:
    result = complete_deferred(deferred_request(), ACTIVE, {})
    assert result == Waiting(waiting_on=("primary-contact",))


def test_retired_target_fails_closed() -> None:
    target = AssociationTarget(link_status=LinkStatus.RETIRED, remote_id="9")
    result = complete_deferred(deferred_request(), ACTIVE, {"primary-contact": target})
    assert isinstance(result, FreezeFailure)


def test_finalized_target_completes_the_body_and_rehashes() -> None:
    request = deferred_request()
    target = AssociationTarget(link_status=LinkStatus.FINALIZED, remote_id="1001")
    result = complete_deferred(request, ACTIVE, {"primary-contact": target})
    assert isinstance(result, CreateRequestSnapshot)
    assert result.body == {"properties": {"name": "Engines", "primary_contact_id": "1001"}}
    assert result.pending_associations == () and result.body_hash != request.body_hash
    assert result.idempotency_key == request.idempotency_key
