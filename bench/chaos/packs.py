"""The campaign's pack and the configuration changes the `pack_apply` actor makes mid-flight.

The campaign's install is the demo pack pointed at its sandbox, with two changes:
- a second contact slot, `push-contact-b`, creating Contact records at the same remote
  destination as `push-contact` and not declared in `separateOwnership`. `pack apply`
  refuses such a pack now (G-2); installs made before that rule exist, so it is
  installed as they were, past the apply-time check, and the admission gate must keep
  one creator per record there (the `two_slot_save` actor);
- the contacts' `keyRetention` is short (`KEY_RETENTION_S`) and the sandbox forgets keys
  exactly then (sandbox.yaml), so a re-send after an outage meets a forgotten key
  (G-5, the `key_expired_resend` actor) within a campaign's minutes.
"""

from __future__ import annotations

import copy
import re
from typing import Any
from unittest.mock import patch

import yaml

from bench.stack import EXAMPLES
from db.records import Conn
from services.packs import ApplyPackResult, apply_pack

SECOND_CONTACT_SLOT = "push-contact-b"
KEY_RETENTION_S = 12  # sandbox.yaml's contacts idempotency_key_ttl_s is the same
# What the actor changes, one at a time; the base pack is applied again after each.
VARIANTS = ("mapping", "credential", "endpoint", "slot_removed", "reinstall")

Manifest = dict[str, Any]


def demo_manifest(sandbox_url: str) -> Manifest:
    """examples/demo-pack.yaml with every profile pointed at this campaign's sandbox."""
    text = (EXAMPLES / "demo-pack.yaml").read_text()
    text = re.sub(r"baseUrl: http://127\.0\.0\.1:\d+", f"baseUrl: {sandbox_url}", text)
    manifest: Manifest = yaml.safe_load(text)
    return manifest


def campaign_manifest(sandbox_url: str) -> Manifest:
    """The demo pack, with the second contact slot and the short contacts key retention."""
    manifest = copy.deepcopy(demo_manifest(sandbox_url))
    slots: list[dict[str, Any]] = manifest["actionSlots"]
    contact = next(s for s in slots if s["id"] == "push-contact")
    second = {**copy.deepcopy(contact), "id": SECOND_CONTACT_SLOT}
    second["flowActionName"] = "Push_Contact_B"
    slots.append(second)
    for profile in manifest["profiles"]:
        post = profile.get("idempotency", {}).get("post")
        if post is not None:
            post["keyRetention"] = f"{KEY_RETENTION_S}s"
    return manifest


def variant(base: Manifest, name: str) -> tuple[Manifest, bool]:
    """`base` with one surface changed, and whether to apply it as a new install."""
    changed = copy.deepcopy(base)
    slots: list[dict[str, Any]] = changed["actionSlots"]
    profiles = {p["name"]: p for p in changed["profiles"]}
    match name:
        case "mapping":  # a mapping row dropped: fail closed for links, frozen for attempts
            deal = next(s for s in slots if s["id"] == "push-deal")
            deal["mappings"] = [m for m in deal["mappings"] if m["sourceField"] != "Amount"]
        case "credential":
            profiles["sandbox-plain"]["credentialGeneration"] = "2"
        case "endpoint":
            profiles["sandbox-locator"]["endpointClass"] = "objects-api-moved"
        case "slot_removed":  # the base pack recreates it afterwards
            changed["actionSlots"] = [s for s in slots if s["id"] != "push-deal"]
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
