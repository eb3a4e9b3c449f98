"""The status view as Prometheus gauges on the worker's metrics endpoint, for alerting.

The same `StatusSnapshot` `connector-push status` draws, read every `STATUS_EVERY`
and published through the Temporal SDK runtime's meter, so it appears beside the
SDK metrics at `CONNECTOR_PUSH_METRICS_BIND_ADDRESS` (which `make dev` sets). A label
set that disappears (a suspend reason no link has any more) is set back to 0.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Final

import asyncpg
from temporalio.common import MetricGaugeFloat, MetricMeter

from db.records import Conn
from protocol.status import StatusSnapshot, gauges
from services.status import read_status
from worker import periodic

STATUS_EVERY: Final = timedelta(seconds=15)
log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]


class StatusGauges:
    def __init__(self, meter: MetricMeter) -> None:
        self._meter = meter
        self._gauges: dict[str, MetricGaugeFloat] = {}
        self._published: set[tuple[str, Labels]] = set()

    def _gauge(self, name: str) -> MetricGaugeFloat:
        if name not in self._gauges:
            self._gauges[name] = self._meter.create_gauge_float(name, "connector-push status view")
        return self._gauges[name]

    def publish(self, snapshot: StatusSnapshot, now: datetime) -> None:
        current: set[tuple[str, Labels]] = set()
        for name, labels, value in gauges(snapshot, now):
            self._gauge(name).set(float(value), labels)
            current.add((name, tuple(sorted(labels.items()))))
        for name, gone in self._published - current:
            self._gauge(name).set(0.0, dict(gone))
        self._published = current


async def publish_status(
    pool: asyncpg.Pool, meter: MetricMeter, stop: asyncio.Event, every: timedelta = STATUS_EVERY
) -> None:
    """Until `stop`: read the snapshot and publish it; a failed read is logged and retried."""
    published = StatusGauges(meter)

    async def publish(conn: Conn) -> None:
        now = datetime.now(UTC)
        published.publish(await read_status(conn, now), now)

    await periodic.every(pool, stop, every, publish, log, "status gauges not refreshed")
