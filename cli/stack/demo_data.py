"""The demo pack and records `connector-push dev` loads so a newcomer has something to push.

The demo pack's `baseUrl`s come from `temporal-dev.yaml` (the sandbox remote), so
moving the sandbox's port is one edit. An owner key that already has an active
pack keeps it: the demo never replaces a pack, whoever applied it.
"""

from __future__ import annotations

from pathlib import Path

import asyncpg

from cli.database import open_connection, read_document
from cli.pack_cmd import validate_manifest_document
from cli.records_cmd import validate_records_file
from cli.stack.derived import replace_keys, service_url
from cli.stack.devconfig import DevConfig
from protocol.manifest import PackManifest
from services.packs import ApplyOutcome, apply_pack, get_active_pack
from services.record_loader import load_records


def demo_files(config: DevConfig) -> tuple[Path, Path]:
    return config.resolve("examples/demo-pack.yaml"), config.resolve("examples/demo-records.yaml")


def demo_manifest(config: DevConfig) -> PackManifest:
    """The demo pack with its destinations pointing at the configured sandbox remote."""
    pack_file, _ = demo_files(config)
    document = replace_keys(read_document(pack_file), {"baseUrl": service_url(config.sandbox)})
    return validate_manifest_document(pack_file, document)


async def _apply_unless_active(conn: asyncpg.Connection, manifest: PackManifest) -> str:
    owner = manifest.connector_owner_key
    active = await get_active_pack(conn, owner)
    if active is not None:
        return (
            f"demo pack: {owner} unchanged (install {active.pack_install_id} is active; "
            "the demo never replaces a pack)"
        )
    applied = await apply_pack(conn, manifest)
    verb = "unchanged" if applied.outcome is ApplyOutcome.UNCHANGED else "installed"
    return f"demo pack: {owner} {verb} (install {applied.pack_install_id})"


async def load_demo(database_url: str, config: DevConfig) -> list[str]:
    """Apply the demo pack (unless its owner has one) and load the demo records; idempotent.

    Both files are validated before anything is written.
    """
    manifest = demo_manifest(config)
    records = validate_records_file(demo_files(config)[1])
    async with open_connection(database_url) as conn:
        pack_line = await _apply_unless_active(conn, manifest)
        loaded = await load_records(conn, records)
    # The users are the records file's (the runtime names no user:
    # the demo's names live in examples/ only).
    users = " and ".join(sorted({grant.user for grant in records.grants}))
    return [
        pack_line,
        f"demo records: {loaded.records_written} written, {loaded.records_unchanged} unchanged, "
        f"{loaded.grants} grants (users {users})",
    ]
