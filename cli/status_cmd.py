"""`connector-push status [--watch] [--json]`: the operator's dashboard (what waits, and why).

The numbers are `services.status.read_status` (one Postgres snapshot), the same
ones the worker publishes as `connector_push_status_*` gauges; the ingress's 503s
come from its own `/metrics` when `--ingress-url` names it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from cli.database import AsJson, DatabaseUrl, bad_input, connect, echo_json
from cli.database import resolve_dsn as _dsn

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from protocol.status import StatusSnapshot

_stdout = Console(highlight=False)
_UNAVAILABLE: Final = re.compile(r"^connector_push_ingress_unavailable_total\{[^}]*\} (\d+)$", re.M)
INGRESS_TIMEOUT_S: Final = 2.0


async def _ingress_503s(url: str | None) -> int | None:
    """The 503s one ingress process counted since it started; None when not asked or down."""
    import httpx

    if url is None:
        return None
    try:
        async with httpx.AsyncClient(timeout=INGRESS_TIMEOUT_S) as client:
            text = (await client.get(url.rstrip("/") + "/metrics")).text
    except httpx.HTTPError:
        return None
    return sum(int(n) for n in _UNAVAILABLE.findall(text))


def _check_ingress_url(url: str) -> None:
    """Exit 2 before anything runs when `--ingress-url` cannot be requested at all."""
    import httpx

    try:
        parsed = httpx.URL(url)
        usable = parsed.scheme in {"http", "https"} and bool(parsed.host)
        usable = usable and (parsed.port is None or 0 < parsed.port < 65_536)
    except httpx.InvalidURL:
        usable = False
    if not usable:
        bad_input(f"--ingress-url {url!r}: not an http(s) URL like http://127.0.0.1:8780")


async def _snapshot(dsn: str, ingress_url: str | None) -> StatusSnapshot:
    from services.status import read_status

    async with connect(dsn) as conn:
        snapshot = await read_status(conn, datetime.now(UTC))
    return snapshot.model_copy(
        update={"ingress_unavailable_total": await _ingress_503s(ingress_url)}
    )


def _counts(title: str, counts: dict[str, int], empty: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, min_width=34)
    table.add_column("label")
    table.add_column("n", justify="right")
    for label, n in sorted(counts.items()):
        table.add_row(escape(label), str(n))
    if not counts:
        table.add_row(f"[dim]{empty}[/]", "0")
    return table


def _activity(s: StatusSnapshot) -> Table:
    from protocol.status import RATE_WINDOW_SECONDS

    window = RATE_WINDOW_SECONDS // 60
    table = Table(title=f"activity (per minute, last {window} min)", title_justify="left",
                  show_header=False, min_width=34)  # fmt: skip
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("queue: pending attempts", str(s.pending_attempts))
    table.add_row("queue: pending PATCHes", str(s.pending_patches))
    table.add_row("creates / min", f"{s.creates_per_minute:.1f}")
    table.add_row("PATCHes / min", f"{s.patches_per_minute:.1f}")
    table.add_row("ingress admissions / min", f"{s.ingress_admissions_per_minute:.1f}")
    shown = "-" if s.ingress_unavailable_total is None else str(s.ingress_unavailable_total)
    table.add_row("ingress 503s (since start)", shown)
    return table


def _oldest(s: StatusSnapshot) -> str:
    if s.oldest_parked is None:
        return "oldest parked: none"
    o = s.oldest_parked
    age = s.taken_at - o.since
    return (
        f"oldest parked: {escape(o.link_key)} ({escape(o.reason)}) for "
        f"{int(age.total_seconds() // 60)} min, since {o.since.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    )


def _daily_quotas(s: StatusSnapshot) -> list[str]:
    """A line per budget with a daily quota (NF-8): spent of its share, the reset."""
    lines = []
    for d in s.daily_quotas:
        allowance = "-" if d.allowance is None else str(d.allowance)
        state = "waiting for the daily quota" if d.waiting else "spending"
        why = " (the remote refused the day)" if d.refused_by_remote else ""
        lines.append(
            f"daily quota {escape(d.budget_key)}: {d.spent} of {allowance} spent, {state}{why}"
            f" until {d.resets_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        )
    return lines


def render(s: StatusSnapshot) -> Group:
    return Group(
        f"[bold]connector-push status[/] at {s.taken_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
        _counts("links by state", s.links_by_state, "no links"),
        _counts(f"parked ({s.parked_total}) by reason", s.parked_by_reason, "nothing parked"),
        _counts("suspended by surface", s.suspended_by_surface, "nothing suspended"),
        _activity(s),
        _oldest(s),
        *_daily_quotas(s),
    )


async def _watch(dsn: str, ingress_url: str | None, every: float) -> None:
    import asyncio

    with Live(render(await _snapshot(dsn, ingress_url)), console=_stdout) as live:
        while True:
            await asyncio.sleep(every)  # the refresh interval itself, not a synchronisation
            live.update(render(await _snapshot(dsn, ingress_url)))


def status_command(
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.5, max=86_400, help="Seconds between refreshes.")
    ] = 5.0,
    ingress_url: Annotated[
        str | None,
        typer.Option("--ingress-url", help="An ingress base URL whose /metrics counts 503s."),
    ] = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Links by state, parked work, suspensions, queue depth and rates, from Postgres."""
    import asyncio

    if watch and as_json:
        bad_input("--watch redraws a terminal view; for data, run `status --json` repeatedly")
    if ingress_url is not None:
        _check_ingress_url(ingress_url)
    dsn = _dsn(database_url)
    if watch:
        try:
            asyncio.run(_watch(dsn, ingress_url, interval))
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
        return
    snapshot = asyncio.run(_snapshot(dsn, ingress_url))
    if as_json:
        echo_json(snapshot.model_dump(mode="json"))
    else:
        _stdout.print(render(snapshot))


def register(app: typer.Typer) -> None:
    app.command("status")(status_command)
