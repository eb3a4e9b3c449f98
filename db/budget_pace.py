"""Named statements for remote budgets' pace (SPEC NF-8, NF-8'; migrations 0150, 0330):
reserve the next request slot of a budget, and take a request's turn in its send window,
each shared by every worker, each in one statement."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class SlotAnswer:
    """A pace's answer: whether a slot was reserved, and the seconds until it (<= 0: it has
    come) or, when none was, until the next free one."""

    reserved: bool
    wait_s: float


async def reserve_slot(
    conn: Conn, budget_key: str, interval_s: float, tolerance_s: float, max_wait_s: float
) -> SlotAnswer:
    """Reserve the budget's next slot unless it is more than `max_wait_s` off."""
    row = await conn.fetchrow(RESERVE_SLOT, budget_key, interval_s, tolerance_s, max_wait_s)
    assert row is not None
    return SlotAnswer(bool(row["reserved"]), float(row["wait_s"]))


# NF-8' (migration 0330): the request may leave now when fewer than $2 of the budget's
# recorded sends are younger than $3 seconds; it is then recorded (the last $2 kept).
# The conflict arm holds the budget's row lock, and its clock is read under it, so two
# senders never both take the last place of one window, and the instant recorded is
# never earlier than the check. A refusal records nothing and answers the seconds until
# the L-th newest send ages out, read from the statement's snapshot: a send committed
# while this one waited for the lock makes it short, never long (the caller asks again).
TAKE_SEND_TURN: Final = """
WITH taken AS (
    INSERT INTO connector_budget_pace AS p (budget_key, next_free, sent)
    VALUES ($1, clock_timestamp(), ARRAY[clock_timestamp()])
    ON CONFLICT (budget_key) DO UPDATE
    SET sent = (p.sent || clock_timestamp())[greatest(1, cardinality(p.sent) + 2 - $2):]
    WHERE cardinality(p.sent) < $2
        OR p.sent[cardinality(p.sent) + 1 - $2]
            <= clock_timestamp() - make_interval(secs => $3)
    RETURNING extract(epoch FROM p.sent[cardinality(p.sent)])::float8 AS at
)
SELECT (SELECT at FROM taken) AS sent_at,
    coalesce((
        SELECT extract(epoch FROM sent[cardinality(sent) + 1 - $2]
            + make_interval(secs => $3) - clock_timestamp())
        FROM connector_budget_pace WHERE budget_key = $1 AND cardinality(sent) >= $2
    ), 0)::float8 AS wait_s
"""


@dataclass(frozen=True)
class SendTurnAnswer:
    """A send window's answer: the instant recorded for the request (epoch seconds on
    Postgres's clock; None: refused), else the seconds until it may ask with success."""

    sent_at: float | None
    wait_s: float


async def take_send_turn(
    conn: Conn, budget_key: str, requests: int, span_s: float
) -> SendTurnAnswer:
    """Record a send of the budget now if its window allows it (at most `requests` in
    any `span_s`), or answer how long until it may be (at least; 0: ask again at once)."""
    row = await conn.fetchrow(TAKE_SEND_TURN, budget_key, requests, span_s)
    assert row is not None
    return SendTurnAnswer(row["sent_at"], float(row["wait_s"]))
