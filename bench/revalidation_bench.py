"""P4: bulk mapping revalidation (SPEC §9) over many finalized links: plan, validate, apply.

The links are inserted in bulk (COPY), each a copy of the link the product
itself would finalize from an admitted attempt, with its own record id, link key
and remote id. A second install of the demo pack changes one mapping, so every
link's mapping and body fingerprints move. The three phases run through the
entry points the CLI uses (`services.revalidation_plan.write_plan`,
`services.revalidation.validate|apply` over a `ManifestFile`), each writing or reading
the manifest as its JSON Lines file, a page at a time, as `revalidate plan --out` and
`revalidate validate|apply FILE` do, on a Postgres with default settings (one lock per
owner key, issue 34). `P4` is links/s over validate + apply together, with every
receipt written and checked.

Alone: `python -m bench.revalidation_bench [--n 100000]` (or `BENCH_P4_N`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from bench.ingress_bench import prepare_database, record
from bench.stack import EXAMPLES, FIELDS
from cli.stack.postgres import EmbeddedPostgres, free_port
from db import links as links_q
from protocol.admission import CreateReserved, SaveRequest
from protocol.identity import link_key
from protocol.revalidation import RevalidationStatus
from protocol.revalidation_manifest import Approval
from services import revalidation, revalidation_plan
from services.admission import admit_locked
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from services.revalidation_source import ManifestFile
from services.rows import link_values

OWNER, ACTION, DESTINATION, OBJECT = "demo-owner", "push-contact", "remote-contacts", "Contact"
TEMPLATE_RECORD = "p4-template"
APPROVAL = Approval(approved_by="bench", approval_reference="P4", reason="bulk mapping move")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pack(drop_phone: bool) -> dict[str, Any]:
    """The demo pack; the second install maps one field fewer, so fingerprints move."""
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / "demo-pack.yaml").read_text())
    if drop_phone:
        manifest = copy.deepcopy(manifest)
        slot = next(s for s in manifest["actionSlots"] if s["id"] == ACTION)
        slot["mappings"] = [m for m in slot["mappings"] if m["sourceField"] != "Phone"]
    return manifest


async def _template(conn: asyncpg.Connection) -> dict[str, Any]:
    """The link columns the product writes when an admitted create finalizes."""
    document = {
        "records": [
            {"object": OBJECT, "id": TEMPLATE_RECORD, "fields": {"Email": "t@example.com"}}
        ],
        "grants": [{"user": "bench", "object": OBJECT, "records": "*", "fields": FIELDS}],
    }
    await load_records(conn, parse_records_document(document))
    save = SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=ACTION,
        destination_slot_id=DESTINATION,
        source_object=OBJECT,
        source_record_id=TEMPLATE_RECORD,
        originating_user_id="bench",
    )
    key = link_key(OWNER, ACTION, OBJECT, TEMPLATE_RECORD, DESTINATION)
    idempotency = str(uuid.uuid4())
    async with conn.transaction():
        await links_q.lock_link_key(conn, key)
        decision = await admit_locked(
            conn, key, save, idempotency, f"cp-{idempotency}", datetime.now(UTC)
        )
    assert isinstance(decision, CreateReserved), decision
    attempt = await conn.fetchrow(
        "SELECT * FROM connector_push_attempt JOIN connector_push_attempt_frozen"
        " USING (attempt_id) WHERE link_key = $1",
        key,
    )
    assert attempt is not None
    return {**link_values(attempt, "template"), "mirror_status": "written"}


def _links(template: dict[str, Any], n: int) -> Iterator[tuple[Any, ...]]:
    # The snapshots are the same in every row: dumped once, not once per row (a million
    # rows spent most of the seed's Python in json.dumps of the same documents).
    shared = {c: json.dumps(v) if isinstance(v, dict | list) else v for c, v in template.items()}
    columns = list(template)
    for i in range(n):
        record_id = f"p4-{i:07d}"
        row = dict(shared)
        row["source_record_id"] = record_id
        row["link_key"] = link_key(OWNER, ACTION, OBJECT, record_id, DESTINATION)
        row["remote_id"] = f"r{i}"
        yield tuple(row[c] for c in columns)


async def seed(conn: asyncpg.Connection, n: int) -> str:
    """Install A, `n` finalized links under it, then install B; returns B's id."""
    await apply_pack(conn, _pack(drop_phone=False))
    template = await _template(conn)
    started = time.monotonic()
    await conn.copy_records_to_table(
        "connector_remote_link", columns=list(template), records=_links(template, n)
    )
    await conn.execute("ANALYZE connector_remote_link")
    log(f"P4: {n} links inserted by COPY in {time.monotonic() - started:.1f} s")
    return (await apply_pack(conn, _pack(drop_phone=True))).pack_install_id


# The writes apply cannot do without, each one set-based statement over every link with
# no lock, read-back or Python in between: a receipt, the link's move onto it (with the
# same foreign-key checks as apply's) and an audit entry each. Timed on the same server
# after apply, then rolled back: P4_floor_per_s is the apply rate Postgres itself allows
# here (NF-3: a baseline from the same run).
FLOOR_STATEMENTS = {
    "receipts": """
        INSERT INTO connector_link_revalidation_receipt (
            operation_id, link_key, manifest_digest, approval_digest,
            mapping_fingerprint_algorithm, body_fingerprint_algorithm, old_mapping_fingerprint,
            new_mapping_fingerprint, old_body_fingerprint, new_body_fingerprint,
            old_pack_install_id, new_pack_install_id, previous_operation_id,
            before_row_digest, after_row_digest)
        SELECT 'p4-floor', link_key, mapping_fingerprint, body_fingerprint, 'a', 'b',
            mapping_fingerprint, body_fingerprint, body_fingerprint, mapping_fingerprint,
            last_validated_pack_install_id, last_validated_pack_install_id, NULL,
            mapping_fingerprint, body_fingerprint
        FROM connector_remote_link
    """,
    "update": """
        UPDATE connector_remote_link
        SET mapping_fingerprint = body_fingerprint, body_fingerprint = mapping_fingerprint,
            last_validated_pack_install_id = created_pack_install_id,
            last_mapping_revalidation_operation_id = 'p4-floor', last_operator = 'p4-floor'
    """,
    "audit": """
        INSERT INTO connector_operator_audit
            (operator, reason, command, link_key, arguments, state_before, state_after, outcome)
        SELECT 'bench', 'p4-floor', 'revalidate-apply', link_key,
            jsonb_build_object('operation_id', 'p4-floor', 'manifest_digest', mapping_fingerprint),
            jsonb_build_object('mapping_fingerprint', mapping_fingerprint),
            jsonb_build_object('mapping_fingerprint', body_fingerprint), 'p4-floor'
        FROM connector_remote_link
    """,
}


async def floor(conn: asyncpg.Connection, n: int) -> dict[str, float]:
    """Seconds per floor statement, and P4_floor_per_s (n over their sum)."""
    seconds: dict[str, float] = {}
    transaction = conn.transaction()
    await transaction.start()
    try:
        for name, statement in FLOOR_STATEMENTS.items():
            started = time.monotonic()
            await conn.execute(statement)
            seconds[name] = time.monotonic() - started
    finally:
        await transaction.rollback()
    parts = ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items())
    log(f"P4 floor (bare writes, rolled back): {parts}, {n / sum(seconds.values()):,.0f} links/s")
    return {"P4_floor_per_s": round(n / sum(seconds.values()))}


async def _timed(phase: str, n: int, work: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = await work
    seconds = time.monotonic() - started
    log(f"P4 {phase}: {seconds:.2f} s, {n / seconds:,.0f} links/s")
    return result, seconds


async def _plan(conn: asyncpg.Connection, install: str, path: Path) -> Path:
    request = revalidation_plan.PlanRequest(
        operation_id="p4-bulk-move", approval=APPROVAL, new_pack_install_id=install
    )
    with path.open("wb") as out:  # what `plan --out` writes
        await revalidation_plan.write_plan(conn, request, out)
    return path


async def _run(conn: asyncpg.Connection, path: Path, *, write: bool) -> RevalidationStatus:
    manifest = ManifestFile.open(path)  # what `validate|apply FILE` checks first
    entry = revalidation.apply if write else revalidation.validate
    return (await entry(conn, manifest)).status


@asynccontextmanager
async def revalidation_postgres(n: int) -> AsyncIterator[str]:
    """A private embedded Postgres with default settings (the lock table included: the
    revalidation takes one lock per owner key, not per member); yields its admin DSN."""
    del n
    root = Path(tempfile.mkdtemp(prefix="cp-bench-p4-"))
    root.chmod(0o755)  # the unprivileged postgres user must reach its data dir
    server = EmbeddedPostgres(root / "data", "127.0.0.1", free_port("127.0.0.1"), durable=True)
    try:
        server.start()
        yield server.dsn("postgres")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def measure(n: int) -> dict[str, float]:
    async with revalidation_postgres(n) as admin_dsn:
        dsn = await prepare_database(admin_dsn)
        conn = await asyncpg.connect(dsn)
        try:
            install = await seed(conn, n)
            path = Path(tempfile.mkdtemp(prefix="cp-bench-p4-manifest-"))
            manifest = path / "p4-bulk-move.jsonl"
            _, plan_s = await _timed("plan", n, _plan(conn, install, manifest))
            validated, validate_s = await _timed("validate", n, _run(conn, manifest, write=False))
            applied, apply_s = await _timed("apply", n, _run(conn, manifest, write=True))
            shutil.rmtree(path, ignore_errors=True)
            receipts = await conn.fetchval(
                "SELECT count(*) FROM connector_link_revalidation_receipt"
            )
            floors = await floor(conn, n)
        finally:
            await conn.close()
    assert validated is RevalidationStatus.VALIDATED, validated
    assert applied is RevalidationStatus.APPLIED and receipts == n, (applied, receipts)
    return {
        "P4": round(n / (validate_s + apply_s)),
        "P4_plan_per_s": round(n / plan_s),
        "P4_validate_per_s": round(n / validate_s),
        "P4_apply_per_s": round(n / apply_s),
        **floors,
        "P4_n": n,
        "P4_load_1m": round(os.getloadavg()[0], 2),  # the machine is shared: say how busy
    }


async def run_revalidation_bench(n: int = 100_000, write: bool = True) -> dict[str, float]:
    results = await measure(n)
    one, five, _ = os.getloadavg()
    print(
        f"P4 = {results['P4']:,} links/s validate + apply; "
        f"plan {results['P4_plan_per_s']:,}/s, validate {results['P4_validate_per_s']:,}/s, "
        f"apply {results['P4_apply_per_s']:,}/s over {n:,} links (load {one:.1f}, {five:.1f}); "
        f"Postgres floor for apply's writes {results['P4_floor_per_s']:,}/s"
    )
    if write:
        record(results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=int(os.environ.get("BENCH_P4_N", "100000")))
    parser.add_argument("--no-write", action="store_true", help="do not touch latest.json")
    args = parser.parse_args()
    asyncio.run(run_revalidation_bench(args.n, not args.no_write))


if __name__ == "__main__":
    main()
