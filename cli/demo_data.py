"""The demo pack and records `connector-push dev` loads so a newcomer has something to push."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from activities.packs import ApplyOutcome, apply_pack
from activities.record_loader import load_records
from cli.pack_cmd import validate_manifest_file
from cli.records_cmd import validate_records_file
from cli.stack.devconfig import DevConfig


def demo_files(config: DevConfig) -> tuple[Path, Path]:
    return config.resolve("examples/demo-pack.yaml"), config.resolve("examples/demo-records.yaml")


async def load_demo(database_url: str, config: DevConfig) -> list[str]:
    """Apply the demo pack and load the demo records; idempotent, so every `dev` run may call it.

    Both files are validated before anything is written.
    """
    pack_file, records_file = demo_files(config)
    manifest = validate_manifest_file(pack_file)
    records = validate_records_file(records_file)
    conn = await asyncpg.connect(database_url)
    try:
        applied = await apply_pack(conn, manifest)
        loaded = await load_records(conn, records)
    finally:
        await conn.close()
    verb = "unchanged" if applied.outcome is ApplyOutcome.UNCHANGED else "installed"
    return [
        f"demo pack: {applied.connector_owner_key} {verb} (install {applied.pack_install_id})",
        f"demo records: {loaded.records_written} written, {loaded.records_unchanged} unchanged, "
        f"{loaded.grants} grants (users alice and bob)",
    ]
