"""The campaign's pack and the configuration changes the `pack_apply` actor makes mid-flight.

The campaign's install is the family's pack (bench/chaos/config.py) pointed at its
sandbox, with two changes:
- a second contact slot (the contact slot's id with `-b`), creating Contact records at
  the same remote destination as the contact slot and not declared in
  `separateOwnership`. `pack apply` refuses such a pack now (G-2); installs made before
  that rule exist, so it is installed as they were, past the apply-time check
  (`apply_legacy`, through db.packs as `pack apply` writes an install), and the admission
  gate must keep one creator per record there (the `two_slot_save` actor);
- where the family declares an idempotency key (the demo pack's contacts), its
  `keyRetention` is short (`Family.key_retention_s`) and the sandbox forgets keys exactly
  then (sandbox.yaml), so a re-send after an outage meets a forgotten key (G-5, the
  `key_expired_resend` actor) within a campaign's minutes.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from bench.chaos.config import Family
from db import packs as packs_q
from db.records import Conn
from protocol.drift import DriftSurface
from protocol.manifest import parse_manifest
from protocol.snapshots import manifest_digest
from services.packs import ACTION_SLOT, REMOVED_SLOT_REASON, ApplyOutcome

# What the actor changes, one at a time; the base pack is applied again after each.
VARIANTS = ("mapping", "credential", "endpoint", "slot_removed", "reinstall")
# Not drawn: the `revalidate_owner` episode's first step, a new install (the contacts
# slot's flowVersion, benign for every link) that leaves finalized links validated under
# an earlier one, so a save suspends them for the install change alone (C-4, DRIFT-2).
UPGRADE = "upgrade"

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


def unkeyed_targets(family: Family, manifest: Manifest) -> list[tuple[str, str]]:
    """(method, path) of the creates whose profile declares no idempotency key, and of the
    PATCHes: where a request re-sent after it landed is a second object or a second write,
    not a replay the remote de-duplicates (the `slow_answer` episode, G-7)."""
    keyed = {p["name"] for p in manifest["profiles"] if p.get("idempotency", {}).get("post")}
    destinations = {d["id"]: d for d in manifest["destinationSlots"]}
    posts = {
        ("POST", slot["createPath"].replace("{target}", destination["targetObject"]))
        for slot in manifest["actionSlots"]
        if (destination := destinations[slot["destinationSlot"]])["profile"] not in keyed
    }
    patches = [(m, path) for m, path in family.fault_targets if m == "PATCH"]
    return [*sorted(posts), *patches]


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
        case "upgrade":
            contact = next(s for s in slots if s["id"] == family.contacts.slot)
            contact["flowVersion"] = f"{contact['flowVersion']}.1"
        case _:
            raise ValueError(f"unknown pack variant {name!r}")
    return changed, False


async def apply_legacy(conn: Conn, manifest: Manifest, *, reinstall: bool = False) -> ApplyOutcome:
    """`manifest` installed as an install made before G-2's apply-time check was (a
    parsed pack, not an installable one), with what `pack apply` does besides that check
    and the claims gate: under the owner's apply lock, the same manifest again is a
    no-op; otherwise the active install is replaced (its successor, or a new incarnation
    when `reinstall`) with its lineage, and the owner's finalized links under an action
    slot the new install lacks are suspended (C-9). The campaign's variants change no
    createPath (C-8) and nothing reads an apply's audit entry, so neither is written."""
    pack = parse_manifest(manifest)
    owner, digest = pack.connector_owner_key, manifest_digest(pack)
    async with conn.transaction():
        await packs_q.lock_owner_key(conn, owner)
        current = await packs_q.select_active_install(conn, owner)
        if current is not None and current.manifest_digest == digest and not reinstall:
            return ApplyOutcome.UNCHANGED
        if current is not None:
            assert await packs_q.deactivate_install(conn, current.pack_install_id)
        previous = current.pack_install_id if current and not reinstall else None
        dumped = json.dumps(pack.model_dump(mode="json", by_alias=True), separators=(",", ":"))
        new = await packs_q.insert_active_install(
            conn, owner, pack.namespace, dumped, digest, previous
        )
        install = new.pack_install_id
        lineage = [
            packs_q.LineageRow(install, ACTION_SLOT, e.kind, e.from_slot, e.to_slot)
            for e in pack.lineage
        ]
        await packs_q.insert_lineage(conn, install, lineage)
        kept = [slot.id for slot in pack.action_slots]
        removed = DriftSurface.ACTION_RECREATED
        await packs_q.suspend_removed_slot_links(
            conn, owner, kept, REMOVED_SLOT_REASON, removed, install
        )
    return ApplyOutcome.INSTALLED
