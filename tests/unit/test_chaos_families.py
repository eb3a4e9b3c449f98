"""The chaos campaign's remote families (bench/chaos/config.py) against the packs and
sandbox configs they name: a description that drifted from its pack would push records
to slots, fields or paths the pack does not have, and the campaign would walk less than
it claims."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from bench.chaos.config import FAMILIES, HERE, Family, family_named
from bench.chaos.packs import UPGRADE, VARIANTS, campaign_manifest, unkeyed_targets, variant
from bench.chaos.stack import sandbox_config
from bench.chaos.world import World
from protocol.manifest import parse_manifest
from sandbox.config import SandboxConfig

URL = "http://127.0.0.1:9"
FAMILY_NAMES = sorted(FAMILIES)


def _pack(family: Family) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(family.pack.read_text())
    return loaded


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_world_pushes_what_the_pack_maps(name: str) -> None:
    family = family_named(name)
    pack = _pack(family)
    slots = {s["id"]: s for s in pack["actionSlots"]}
    destinations = {d["id"]: d for d in pack["destinationSlots"]}
    assert pack["connectorOwnerKey"] == family.owner
    assert {p.slot for p in family.profiles} == set(slots)
    for profile in family.profiles:
        slot, destination = slots[profile.slot], destinations[profile.destination]
        assert slot["sourceObject"] == profile.source_object
        assert slot["destinationSlot"] == profile.destination
        assert (destination["targetObject"], destination["profile"]) == (
            profile.target,
            profile.name,
        )
        sent = {m["sourceField"] for m in slot["mappings"]}
        sent |= {a["sourceField"] for a in slot.get("associations", [])}
        assert sent == set(profile.fields), profile.slot
        # The fault rules' create path is the slot's own.
        create = slot["createPath"].replace("{target}", profile.target)
        assert create in family.post_paths
    company = slots[family.companies.slot]
    assert family.companies_wait_on_contact == bool(company.get("associations"))
    assert family.post_paths[0].rstrip("/").endswith(family.contacts.target)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_faults_and_side_paths_follow_what_the_pack_declares(name: str) -> None:
    family = family_named(name)
    manifest = parse_manifest(_pack(family))
    for profile in manifest.profiles:
        declared = {*profile.not_applied_statuses, *(a.status for a in profile.not_applied_answers)}
        assert set(family.not_applied_statuses) <= declared, profile.name
    keyed = [p for p in manifest.profiles if p.idempotency and p.idempotency.post]
    assert (family.key_retention_s is None) == (not keyed)
    assert ("key_expired_resend" in family.not_applicable) == (not keyed)
    refs = {p.credential_ref for p in manifest.profiles}
    if family.credential_ref is not None:
        assert refs == {family.credential_ref}


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_pack_apply_variant_changes_the_campaign_pack(name: str) -> None:
    family = family_named(name)
    base = campaign_manifest(family, URL)
    second = [s for s in base["actionSlots"] if s["id"] == family.second_contacts.slot]
    assert [s["destinationSlot"] for s in second] == [family.contacts.destination]
    assert {p["baseUrl"] for p in base["profiles"]} == {URL}
    for name_ in (*VARIANTS, UPGRADE):
        changed, reinstall = variant(family, base, name_)
        assert reinstall == (name_ == "reinstall")
        assert (changed == base) == reinstall, name_
        parse_manifest(changed)
    # The removal episode's upgrade keeps every slot, so it suspends nothing by itself.
    upgraded = variant(family, base, UPGRADE)[0]
    assert [s["id"] for s in upgraded["actionSlots"]] == [s["id"] for s in base["actionSlots"]]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_slow_answers_drip_where_a_re_send_writes_twice(name: str) -> None:
    """The `slow_answer` episode drips every create whose profile declares no idempotency
    key (a re-send there is a second object, not a replay) and every PATCH."""
    family = family_named(name)
    targets = unkeyed_targets(family, campaign_manifest(family, URL))
    keyed = {family.post_paths[0]} if family.key_retention_s is not None else set()
    assert {path for method, path in targets if method == "POST"} == set(family.post_paths) - keyed
    assert ("PATCH", next(p for m, p in family.fault_targets if m == "PATCH")) in targets


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_sandbox_serves_the_family(name: str, tmp_path: Any) -> None:
    family = family_named(name)
    path = sandbox_config(family, tmp_path)
    config = SandboxConfig.model_validate(yaml.safe_load(path.read_text()))
    assert set(family.object_types) <= set(config.object_types)
    expected_mode = "generous" if family.credential_ref is None else family.name
    assert config.mode == expected_mode


def test_the_demo_family_is_the_campaign_it_was() -> None:
    demo = family_named("demo")
    assert demo.sandbox == HERE / "sandbox.yaml"
    assert demo.second_contacts.slot == "push-contact-b"
    assert demo.object_types == ("contacts", "companies", "deals")
    world = World(1, 60, demo)
    company = world.records[demo.companies][0]
    assert world.dependency(company.link_key) is not None
    assert "PrimaryContactId" in world.fields(company)


def test_a_family_without_associations_has_no_waiting_creates() -> None:
    salesforce = family_named("salesforce")
    world = World(1, 60, salesforce)
    assert set(world.records) == {salesforce.contacts, salesforce.companies}
    company = world.records[salesforce.companies][0]
    assert world.dependency(company.link_key) is None
    assert set(world.fields(company)) == set(salesforce.companies.fields)


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="one of demo, hubspot, salesforce"):
        family_named("pipedrive")
