"""Named statement for remote budgets' pace (SPEC NF-8, migration 0150): reserve the next
request slot of a budget, shared by every worker, in one statement."""

from __future__ import annotations

from typing import Final

from db.records import Conn

# GCRA with reservations: the slot is the later of the budget's next free instant and
# now less the tolerance (an idle budget may catch up that much at once); the next
# request's slot is one interval after it. A slot more than $4 seconds off is not
# reserved (the row is left as it was). Answers whether a slot was reserved and the
# seconds until it (<= 0: it has come), or until the next free one if none was.
RESERVE_SLOT: Final = """
WITH now AS (SELECT clock_timestamp() AS at),
slot AS (
    SELECT greatest(
        coalesce(
            (SELECT next_free FROM connector_budget_pace WHERE budget_key = $1), now.at
        ),
        now.at - make_interval(secs => $3)
    ) AS at
    FROM now
),
taken AS (
    INSERT INTO connector_budget_pace AS p (budget_key, next_free)
    SELECT $1, slot.at + make_interval(secs => $2) FROM slot, now
    WHERE slot.at <= now.at + make_interval(secs => $4)
    ON CONFLICT (budget_key) DO UPDATE
    SET next_free = greatest(p.next_free, clock_timestamp() - make_interval(secs => $3))
        + make_interval(secs => $2)
    WHERE greatest(p.next_free, clock_timestamp() - make_interval(secs => $3))
        <= clock_timestamp() + make_interval(secs => $4)
    RETURNING p.next_free - make_interval(secs => $2) AS at
)
SELECT (SELECT at FROM taken) IS NOT NULL AS reserved,
    extract(epoch FROM coalesce((SELECT at FROM taken), (SELECT at FROM slot)) - now.at)
        ::float8 AS wait_s
FROM now
"""


async def reserve_slot(
    conn: Conn, budget_key: str, interval_s: float, tolerance_s: float, max_wait_s: float
) -> tuple[bool, float]:
    """Reserve the budget's next slot unless it is more than `max_wait_s` off: (whether
    one was reserved, the seconds until it or until the next free one)."""
    row = await conn.fetchrow(RESERVE_SLOT, budget_key, interval_s, tolerance_s, max_wait_s)
    assert row is not None
    return bool(row["reserved"]), float(row["wait_s"])
