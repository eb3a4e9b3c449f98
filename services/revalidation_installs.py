"""What a pack install produces for a link's action slot: the fingerprints a revalidation
member's new values must equal (REV-2 item 6), resolved once per install and slot."""

from __future__ import annotations

from db import packs as packs_q
from db.records import Conn
from protocol.active import resolve_active
from protocol.link_row import LinkRowState
from protocol.manifest import ManifestInvalid, PackManifest
from protocol.manifest import parse_manifest as parse_pack_manifest
from protocol.revalidation import InstallFingerprints
from protocol.snapshots import ActionConfigSnapshot


async def install_manifest(conn: Conn, pack_install_id: str) -> PackManifest | None:
    install = await packs_q.select_install(conn, pack_install_id)
    if install is None:
        return None
    try:
        return parse_pack_manifest(install.manifest)
    except ManifestInvalid:
        return None


# What an install produces depends on the install and the row's two slot ids only; a bulk
# manifest has thousands of members per slot, so it is resolved once per slot (bench P4).
SlotFingerprints = dict[tuple[str, str, str], InstallFingerprints | None]


def slot_fingerprints(
    cache: SlotFingerprints, pack: PackManifest, install_id: str, row: LinkRowState
) -> InstallFingerprints | None:
    """`install_fingerprints`, remembered in `cache` by (install, action, destination slot)."""
    slot = (install_id, row.action_slot_id, row.destination_slot_id)
    if slot not in cache:
        cache[slot] = install_fingerprints(pack, install_id, row)
    return cache[slot]


def install_fingerprints(
    pack: PackManifest, install_id: str, row: LinkRowState
) -> InstallFingerprints | None:
    """What `install_id` (its manifest `pack`) produces for `row`'s action slot, or None."""
    active = resolve_active(pack, install_id, row.action_slot_id, row.destination_slot_id)
    if active.action is None:
        return None
    config = ActionConfigSnapshot.of(active.action)
    return InstallFingerprints(
        mapping_fingerprint=config.mapping_fingerprint, body_fingerprint=config.body_fingerprint
    )
