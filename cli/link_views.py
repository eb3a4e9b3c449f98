"""`links find` and `links show`: find a link by what you know, then one view of its key
(SPEC OPS-1, JRN-1). Both answer from Postgres, the source of truth, with `--json` too;
`find` pages by cursor (`cli.paging`, NF-7)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli import paging
from cli.database import AsJson, DatabaseUrl, bad_input, connect, resolve_dsn
from cli.errors import fail
from protocol.park_reason import ParkReason
from protocol.states import AttemptStatus, LinkStatus, PatchStatus

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    import asyncpg

    from protocol.messages import LinkView

console = Console()
PATCHES_SHOWN: Final = 20
FIND_LIMIT: Final = 500
CANDIDATES: Final = 1_000  # parked keys read at once for `--park-reason`
JOURNAL_COLUMNS: Final = (
    "journal_id",
    "attempt_ordinal",
    "patch_id",
    "method",
    "sending_at",
    "outcome",
    "status",
    "retry_after_seconds",
    "may_have_landed",
)
# The shape the database's CHECK constraint accepts (ID-2).
LINK_KEY_SHAPE: Final = re.compile(r"lk[0-9]+_[0-9a-f]{64}")
T = TypeVar("T")


def _run(dsn: str, query: Callable[[asyncpg.Connection], Coroutine[Any, Any, T]]) -> T:
    import asyncio

    async def run() -> T:
        async with connect(dsn) as conn:
            return await query(conn)

    return asyncio.run(run())


# -- links show -------------------------------------------------------------------------


async def key_view(conn: asyncpg.Connection, key: str, all_patches: bool) -> dict[str, Any]:
    """Everything Postgres holds about one key, JSON-ready (empty lists when none)."""
    from datetime import UTC, datetime

    from db import journal as journal_q
    from db import key_view as kq
    from db import links as links_q
    from db import remote_deletions as deletions_q
    from protocol.park import park_reason, remedy_for
    from services.daily_quota import link_waiting_until
    from services.landing import with_landing
    from services.rows import view_of

    link = await kq.link_row(conn, key)
    journal = [{c: r[c] for c in JOURNAL_COLUMNS} for r in await journal_q.link_journal(conn, key)]
    attempts = [dict(r) for r in await kq.attempts(conn, key)]
    for attempt in attempts:
        ordinal = attempt["attempt_ordinal"]
        attempt["send_journal"] = [t for t in journal if t["attempt_ordinal"] == ordinal]
    link_data = dict(link) if link is not None else None
    findings = json.loads(link_data.pop("drift_findings") or "[]") if link_data else []
    link_view = await with_landing(conn, view_of(key, await links_q.view_rows(conn, key)))
    reason = park_reason(link_view)
    remedy = (
        remedy_for(reason, link_view.suspend_reason, link_view.attempt_landing) if reason else None
    )
    return {
        "link_key": key,
        "park_reason": reason.value if reason else None,
        "remedy": remedy.what.replace("KEY", key) if remedy else None,
        # G-6: the evidence that decides between the remedy's actions, and those actions.
        "remedy_evidence": remedy.evidence.replace("KEY", key) if remedy else None,
        "remedy_actions": [a.value for a in remedy.actions] if remedy else [],
        # G-6: what the parked ambiguous attempt's send journal proves (`protocol.landing`).
        "attempt_landing": link_view.attempt_landing,
        # A spent daily quota is not parked; the run resumes by itself at the quota's reset.
        "waiting_for_daily_quota_until": await link_waiting_until(conn, key, datetime.now(UTC)),
        "link": link_data,
        "attempts": attempts,
        "patches": [
            dict(r) for r in await kq.patches(conn, key, None if all_patches else PATCHES_SHOWN)
        ],
        "patches_total": await kq.patch_count(conn, key),
        "send_journal": journal,
        "drift_findings": findings,
        "operator_actions": [dict(r) for r in await kq.operator_actions(conn, key)],
        # G-8: deletion events recorded for the link's remote object, in any link state.
        "remote_deletions": [
            d.model_dump(mode="json")
            for d in (await deletions_q.of_links(conn, [key])).get(key, [])
        ],
    }


def _has_rows(view: dict[str, Any]) -> bool:
    return bool(view["link"] or view["attempts"] or view["patches_total"])


def _print_show(view: dict[str, Any]) -> None:
    key = view["link_key"]
    console.print(f"[bold]{escape(key)}[/]", highlight=False)
    if view["attempt_landing"] == "proved_not_landed":
        from protocol.landing import PROOF

        console.print(f"[bold]no try landed:[/] {escape(PROOF)} (evidence kept below)")
    if view["park_reason"]:
        console.print(
            f"[bold red]needs operator: {view['park_reason']}[/] {escape(view['remedy'])}"
        )
        console.print(f"[bold]evidence that decides it:[/] {escape(view['remedy_evidence'])}")
    if view["waiting_for_daily_quota_until"]:
        from protocol.daily_quota import waiting_detail

        until = view["waiting_for_daily_quota_until"]
        console.print(f"[bold]{waiting_detail(until)}[/] (not parked: resumes by itself)")
    if view["link"] is None:
        console.print("link: no link yet (a create is pending, parked or failed)")
    else:
        print_rows([{"field": k, "value": v} for k, v in view["link"].items()], f"link {key}")
    for attempt in view["attempts"]:
        fields = {k: v for k, v in attempt.items() if k != "send_journal"}
        print_rows(
            [{"field": k, "value": v} for k, v in fields.items()],
            f"attempt #{fields['attempt_ordinal']}",
        )
        print_rows(attempt["send_journal"], f"attempt #{fields['attempt_ordinal']} send journal")
    shown, total = len(view["patches"]), view["patches_total"]
    more = f" (newest {shown} of {total}; --all for every one)" if shown < total else ""
    print_rows(view["patches"], "PATCHes" + more)
    print_rows([t for t in view["send_journal"] if t["patch_id"]], "PATCH send journal")
    print_rows(view["drift_findings"], "drift findings")
    print_rows(view["operator_actions"], "operator actions")
    if view["remote_deletions"]:
        print_rows(view["remote_deletions"], "remote deletion events (G-8)")


def print_rows(rows: list[dict[str, Any]], title: str) -> None:
    """One rich table of `rows` under `title`; every value printed as given, not as markup."""
    table = Table(title=escape(title))
    for column in rows[0] if rows else ["(none)"]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(escape(str(v)) if v is not None else "" for v in row.values()))
    console.print(table)


# -- links find -------------------------------------------------------------------------


def _found(row: asyncpg.Record) -> dict[str, Any]:
    from protocol.park import park_reason
    from protocol.summary import LinkFacts, link_summary

    facts = LinkFacts.model_validate({k: row[k] for k in LinkFacts.model_fields})
    reason = park_reason(_find_view(row))
    return {
        "link_key": row["link_key"],
        "summary": link_summary(facts, row["link_key"]),
        "link_status": row["link_status"],
        "attempt": f"#{row['attempt_ordinal']} {row['attempt_status']}"
        if row["attempt_id"]
        else None,
        "remote_id": row["remote_id"],
        "park_reason": reason.value if reason else None,
    }


def _find_view(row: asyncpg.Record) -> LinkView:
    """Just enough of the workflow's view for `park_reason` (the same rule it publishes)."""
    from protocol.messages import LinkView

    return LinkView(
        link_key=row["link_key"],
        link_status=LinkStatus(row["link_status"]) if row["link_status"] else None,
        attempt_status=AttemptStatus(row["attempt_status"]) if row["attempt_status"] else None,
        suspend_reason=row["suspend_reason"],
        last_patch_status=PatchStatus(row["last_patch_status"])
        if row["last_patch_status"]
        else None,
        pending_patches=[PatchStatus.PENDING] if row["patch_queued"] else [],
    )


async def find(
    conn: asyncpg.Connection,
    record_id: str | None,
    remote_id: str | None,
    reason: ParkReason | None,
    after: str = "",
    limit: int = FIND_LIMIT,
) -> AsyncGenerator[dict[str, Any]]:
    """The keys matching after `after`, in link-key order, at most `limit + 1` (the extra
    one says there are more). Park reasons are computed here, so candidates are read in
    batches until enough match."""
    from db import link_search as sq

    wanted = limit + 1
    while wanted > 0:
        batch = wanted if reason is None else max(wanted, CANDIDATES)
        if record_id is not None:
            rows = await sq.links_by_record_id(conn, record_id, after, batch)
        elif remote_id is not None:
            rows = await sq.links_by_remote_id(conn, remote_id, after, batch)
        else:
            rows = await sq.parked_candidates(conn, after, batch)
        for row in rows:
            found = _found(row)
            if reason is None or found["park_reason"] == reason.value:
                yield found
                wanted -= 1
                if wanted == 0:
                    return
        if len(rows) < batch:
            return
        after = rows[-1]["link_key"]


def _park_reason(value: str | None) -> ParkReason | None:
    if value is None:
        return None
    try:
        return ParkReason(value)
    except ValueError:
        choices = ", ".join(r.value for r in ParkReason)
        bad_input(f"--park-reason {value!r} is not one of: {choices}")


def register(links: typer.Typer) -> None:
    @links.command("show")
    def links_show(
        link_key: str,
        all_patches: Annotated[
            bool, typer.Option("--all", help=f"every PATCH (default: the newest {PATCHES_SHOWN})")
        ] = False,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """One view of a key: its link (or none yet), every attempt with its frozen request
        and send journal, PATCHes, drift findings, operator actions and any deletion
        events recorded for its remote object."""
        if not LINK_KEY_SHAPE.fullmatch(link_key):
            bad_input(f"{link_key!r} is not a link key (lk1_ and 64 hex digits)")
        view = _run(resolve_dsn(database_url), lambda c: key_view(c, link_key, all_patches))
        if not _has_rows(view):
            fail(f"no link and no attempt for {link_key!r} (no rows for this key)", code=2)
        if as_json:
            console.print_json(json.dumps(view, default=str))
        else:
            _print_show(view)

    @links.command("find")
    def links_find(
        record_id: Annotated[
            str | None, typer.Option("--record-id", help="the CRM record's id (SourceRecordId)")
        ] = None,
        remote_id: Annotated[
            str | None, typer.Option("--remote-id", help="the remote object's id (RemoteId)")
        ] = None,
        park_reason_name: Annotated[
            str | None,
            typer.Option("--park-reason", help="why it waits: " + ", ".join(ParkReason)),
        ] = None,
        limit: Annotated[
            int, typer.Option("--limit", min=1, max=100_000, help="link keys per page")
        ] = FIND_LIMIT,
        after: paging.After = None,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """Find link keys by what you know: a record id, a remote id or a park reason; a
        page at a time in link-key order (stderr names the next page)."""
        given = [
            (option, v)
            for option, v in (
                ("--record-id", record_id),
                ("--remote-id", remote_id),
                ("--park-reason", park_reason_name),
            )
            if v is not None
        ]
        if len(given) != 1:
            bad_input("give exactly one of --record-id, --remote-id, --park-reason")
        reason = _park_reason(park_reason_name)
        start = paging.text_cursor(after, "find") or ""
        shown: list[dict[str, Any]] = []

        async def page(conn: asyncpg.Connection) -> dict[str, Any] | None:
            found = find(conn, record_id, remote_id, reason, start, limit)
            return await paging.take(found, limit, paging.json_line if as_json else shown.append)

        last = _run(resolve_dsn(database_url), page)
        if not as_json:
            if shown:
                print_rows(shown, f"{len(shown)} link key(s)" + (", more follow" if last else ""))
            else:
                console.print("no link key has rows matching that")
        if last is not None:
            command = ["links", "find", *given[0]]
            if limit != FIND_LIMIT:
                command += ["--limit", str(limit)]
            cursor = paging.encode_cursor("find", last["link_key"])
            paging.say_more(command, cursor, as_json, database_url is not None)
