"""PACK-1: the demo manifest is accepted; each invalid manifest names the offending field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from protocol.manifest import ManifestInvalid, lineage_predecessors
from protocol.snapshots import (
    ProfileSnapshot,
    body_fingerprint,
    manifest_digest,
    mapping_fingerprint,
    profile_payload_hash,
)
from tests.unit.factories import demo_manifest

Doc = dict[str, Any]


def test_demo_manifest_is_accepted() -> None:
    manifest = demo_manifest()
    assert [s.id for s in manifest.action_slots] == ["push-contact", "push-company", "push-deal"]
    contact = manifest.profile("sandbox-idempotent")
    assert contact is not None and contact.idempotency.post is not None
    assert contact.idempotency.post.header == "Idempotency-Key"
    locator = manifest.profile("sandbox-locator")
    assert locator is not None and locator.locator_recovery is not None


def _slot(doc: Doc, i: int = 0) -> Doc:
    slot: Doc = doc["actionSlots"][i]
    return slot


def _set(path: str, value: object) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return mutate


def _duplicate_slot(doc: Doc) -> None:
    doc["actionSlots"][1]["id"] = "push-contact"


def _duplicate_mapping(doc: Doc) -> None:
    _slot(doc)["mappings"].append({"sourceField": "Other", "remoteProperty": "email"})


def _drop_credential_ref(doc: Doc) -> None:
    del doc["profiles"][0]["credentialRef"]


def _lineage_cycle(doc: Doc) -> None:
    doc["lineage"] = [
        {"kind": "rebind", "fromSlot": "old-a", "toSlot": "old-b"},
        {"kind": "rebind", "fromSlot": "old-b", "toSlot": "old-a"},
    ]


def _drop_create_path(doc: Doc) -> None:
    del _slot(doc)["createPath"]


INVALID: list[tuple[str, Callable[[Doc], None], str, str]] = [
    ("duplicate slot id", _duplicate_slot, "actionSlots[1]", "duplicate id"),
    (
        "undeclared destination",
        _set("actionSlots.0.destinationSlot", "nowhere"),
        "actionSlots[0].destinationSlot",
        "not declared",
    ),
    ("missing create path", _drop_create_path, "actionSlots[0].createPath", "Field required"),
    (
        "record-derived create path",
        _set("actionSlots.0.createPath", "/crm/v3/objects/{record.Type}"),
        "actionSlots[0].createPath",
        "record-derived",
    ),
    (
        "unknown placeholder",
        _set("actionSlots.0.updatePath", "/crm/v3/objects/{target}/{remoteId}/{tenant}"),
        "actionSlots[0].updatePath",
        "unknown placeholder {tenant}",
    ),
    (
        "update path without remote id",
        _set("actionSlots.0.updatePath", "/crm/v3/objects/{target}"),
        "actionSlots[0].updatePath",
        "remoteId",
    ),
    (
        "unsupported responseIdPath",
        _set("actionSlots.0.responseIdPath", "$..id"),
        "actionSlots[0].responseIdPath",
        "unsupported",
    ),
    ("duplicate remote property", _duplicate_mapping, "actionSlots[0].mappings", "email"),
    ("lineage cycle", _lineage_cycle, "lineage[0]", "cycle"),
    (
        "profile without CredentialRef",
        _drop_credential_ref,
        "profiles[0].credentialRef",
        "required",
    ),
    (
        "literal token as CredentialRef",
        _set("profiles.0.credentialRef", "pat-na1-0123456789abcdef"),
        "profiles[0].credentialRef",
        "must be a credential reference (env:NAME)",
    ),
    (
        "undeclared CredentialRef scheme",
        _set("profiles.1.credentialRef", "plain:SANDBOX_TOKEN"),
        "profiles[1].credentialRef",
        "not a secret",
    ),
    (
        "undeclared profile",
        _set("destinationSlots.0.profile", "ghost"),
        "destinationSlots[0].profile",
        "not a declared profile",
    ),
    (
        "unknown key",
        _set("actionSlots.0.bodyTemplate", "x"),
        "actionSlots[0].bodyTemplate",
        "Extra",
    ),
    (
        "padded stable id",
        _set("connectorOwnerKey", " demo"),
        "connectorOwnerKey",
        "whitespace",
    ),
    (
        "association to unknown slot",
        _set("actionSlots.1.associations.0.targetActionSlot", "push-ghost"),
        "actionSlots[1].associations[0].targetActionSlot",
        "not a declared action slot",
    ),
    (
        "lookup path without locator",
        _set("profiles.2.locatorRecovery.lookupPath", "/crm/v3/objects/{target}"),
        "profiles[2].locatorRecovery.lookupPath",
        "locator",
    ),
    (
        "rebind without target",
        _set("lineage.0", {"kind": "rebind", "fromSlot": "old"}),
        "lineage[0]",
        "toSlot",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [pytest.param(m, f, msg, id=name) for name, m, f, msg in INVALID],
)
def test_invalid_manifest_names_the_field(
    mutate: Callable[[Doc], None], field: str, message: str
) -> None:
    with pytest.raises(ManifestInvalid) as info:
        demo_manifest(mutate)
    text = str(info.value)
    assert field in text, text
    assert message in text, text


@pytest.mark.parametrize("token", ["Bearer sk_live_51Hx", "pat-na1-0123456789abcdef", "env:a b"])
def test_a_literal_credential_is_refused_without_echoing_it(token: str) -> None:
    """Issue 14 item 7 / STO-3: a pasted secret never reaches the message (nor a cause)."""
    with pytest.raises(ManifestInvalid) as info:
        demo_manifest(_set("profiles.0.credentialRef", token))
    assert "profiles[0].credentialRef" in str(info.value)
    assert token not in str(info.value) and info.value.__cause__ is None


@pytest.mark.parametrize(
    "url",
    ["http://user:s3cretpw@127.0.0.1:8765", "https://u:s3c/retpw@api.example", "http://s3cretpw@h"],
)
def test_a_base_url_with_user_information_is_refused_without_echoing_it(url: str) -> None:
    """Was stored and shown by `pack show`: a credential pasted into baseUrl."""
    with pytest.raises(ManifestInvalid) as info:
        demo_manifest(_set("profiles.0.baseUrl", url))
    assert "profiles[0].baseUrl" in str(info.value) and "user information" in str(info.value)
    assert "s3c" not in str(info.value) and info.value.__cause__ is None


def test_lineage_predecessors_are_transitive() -> None:
    def chain(doc: Doc) -> None:
        doc["lineage"] = [
            {"kind": "rebind", "fromSlot": "v0", "toSlot": "v1"},
            {"kind": "rebind", "fromSlot": "v1", "toSlot": "push-contact"},
            {"kind": "retire", "fromSlot": "gone"},
        ]

    assert set(lineage_predecessors(demo_manifest(chain), "push-contact")) == {"v0", "v1"}


def test_digests_are_deterministic_and_sensitive() -> None:
    first, second = demo_manifest(), demo_manifest()
    assert manifest_digest(first) == manifest_digest(second)

    def rename(doc: Doc) -> None:
        doc["profiles"][0]["name"] = "renamed"
        doc["destinationSlots"][0]["profile"] = "renamed"

    renamed = demo_manifest(rename)
    changed = demo_manifest(_set("profiles.0.retryPolicy.maxAttempts", 9))
    # A profile rename is not a payload change; a retry policy change is.
    p0, p1, p2 = first.profiles[0], renamed.profiles[0], changed.profiles[0]
    assert profile_payload_hash(p0) == profile_payload_hash(p1)
    assert profile_payload_hash(p0) != profile_payload_hash(p2)
    assert ProfileSnapshot.of(p0).retry_policy_hash != ProfileSnapshot.of(p2).retry_policy_hash
    assert manifest_digest(first) != manifest_digest(changed)


def test_mapping_and_body_fingerprints() -> None:
    base = demo_manifest().action_slots[0]
    required = demo_manifest(_set("actionSlots.0.mappings.1.required", True)).action_slots[0]
    # `required` is a mapping change but not a body-shape change.
    assert mapping_fingerprint(base) != mapping_fingerprint(required)
    assert body_fingerprint(base) == body_fingerprint(required)
