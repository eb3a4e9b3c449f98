"""Read the status snapshot (`connector-push status`) in one read-only, repeatable-read transaction,
so every number on the dashboard (and every gauge) comes from the same moment."""

from __future__ import annotations

from datetime import datetime, timedelta

from db import status as q
from db.daily_quota import current_days
from db.records import Conn
from protocol.status import RATE_WINDOW_SECONDS, DailyQuotaDay, OldestParked, StatusSnapshot


async def read_status(conn: Conn, now: datetime) -> StatusSnapshot:
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        attempts, patches = await q.queue_depth(conn)
        since = now - timedelta(seconds=RATE_WINDOW_SECONDS)
        creates, patched, admitted = await q.recent(conn, since)
        oldest = await q.oldest_parked(conn)
        per_minute = 60.0 / RATE_WINDOW_SECONDS
        return StatusSnapshot(
            taken_at=now,
            links_by_state=await q.links_by_state(conn),
            parked_by_reason=await q.parked_by_reason(conn),
            suspended_by_surface=await q.suspended_by_surface(conn),
            pending_attempts=attempts,
            pending_patches=patches,
            creates_per_minute=creates * per_minute,
            patches_per_minute=patched * per_minute,
            ingress_admissions_per_minute=admitted * per_minute,
            oldest_parked=None
            if oldest is None
            else OldestParked(link_key=oldest[0], reason=oldest[1], since=oldest[2]),
            daily_quotas=[
                DailyQuotaDay(
                    budget_key=d.budget_key,
                    day=d.quota_day,
                    spent=d.spent,
                    allowance=d.allowance,
                    resets_at=d.resets_at,
                    refused_by_remote=d.refused_at is not None,
                )
                for d in await current_days(conn, now)
            ],
        )
