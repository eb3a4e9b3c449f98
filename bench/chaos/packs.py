"""The campaign's pack and the configuration changes the `pack_apply` actor makes mid-flight.

The campaign's install is the family's pack (bench/chaos/config.py) pointed at its
sandbox, with two changes:
- a second contact slot (the contact slot's id with `-b`), creating Contact records at
  the same remote destination as the contact slot and not declared in
  `separateOwnership`. `pack apply` refuses such a pack now (G-2); installs made before
  that rule exist, so it is installed as they were, past the apply-time check, and the
  admission gate must keep one creator per record there (the `two_slot_save` actor);
- where the family declares an idempotency key (the demo pack's contacts), its
  `keyRetention` is short (`Family.key_retention_s`) and the sandbox forgets keys exactly
  then (sandbox.yaml), so a re-send after an outage meets a forgotten key (G-5, the
  `key_expired_resend` actor) within a campaign's minutes.
"""

from __future__ import annotations

import copy
from typing import Any
from unittest.mock import patch

import yaml

from bench.chaos.config import Family
from db.records import Conn
from services.packs import ApplyPackResult, apply_pack

# What the actor changes, one at a time; the base pack is applied again after each.
VARIANTS = ("mapping", "credential", "endpoint", "slot_removed", "reinstall")

Manifest = dict[str, Any]


def family_manifest(family: Family, sandbox_url: str) -> Manifest:
    """The family's pack with every profile pointed at this campaign's sandbox."""
    manifest: Manifest = yaml.safe_load(family.pack.read_text())
    for profile in manifest["profiles"]:
        profile["baseUrl"] = sandbox_url
    return manifest


def campaign_manifest(family: Family, sandbox_url: str) -> Manifest:
    """The family's pack, with the second contact slot and a short contacts key retention."""
    manifest = family_manifest(family, sandbox_url)
    slots: list[dict[str, Any]] = manifest["actionSlots"]
    contact = next(s for s in slots if s["id"] == family.contacts.slot)
    second = {**copy.deepcopy(contact), "id": family.second_contacts.slot}
    second["flowActionName"] = f"{contact['flowActionName']}_B"
    slots.append(second)
    for profile in manifest["profiles"]:
        post = profile.get("idempotency", {}).get("post")
        if post is not None:
            post["keyRetention"] = f"{family.key_retention_s}s"
    return manifest


def variant(family: Family, base: Manifest, name: str) -> tuple[Manifest, bool]:
    """`base` with one surface changed, and whether to apply it as a new install."""
    changed = copy.deepcopy(base)
    slots: list[dict[str, Any]] = changed["actionSlots"]
    profiles = {p["name"]: p for p in changed["profiles"]}
    where = family.variants
    match name:
        case "mapping":  # a mapping row dropped: fail closed for links, frozen for attempts
            slot_id, field = where.mapping
            slot = next(s for s in slots if s["id"] == slot_id)
            slot["mappings"] = [m for m in slot["mappings"] if m["sourceField"] != field]
        case "credential":
            profiles[where.credential]["credentialGeneration"] = "2"
        case "endpoint":
            moved = profiles[where.endpoint]
            moved["endpointClass"] = f"{moved['endpointClass']}-moved"
        case "slot_removed":  # the base pack recreates it afterwards
            changed["actionSlots"] = [s for s in slots if s["id"] != where.slot_removed]
        case "reinstall":
            return changed, True
        case _:
            raise ValueError(f"unknown pack variant {name!r}")
    return changed, False


async def apply_legacy(
    conn: Conn, manifest: Manifest, *, reinstall: bool = False, reason: str = ""
) -> ApplyPackResult:
    """`apply_pack`, past G-2's apply-time check (as an install made before it was)."""
    with patch("services.packs.check_installable", lambda checked: checked):
        return await apply_pack(
            conn, manifest, reinstall=reinstall, operator="chaos-operator", reason=reason
        )
