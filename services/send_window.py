"""The send window every remote request takes its turn in, right before it leaves (SPEC
NF-8', PROF-3): the bound on a budget's requests at the remote, shared by every worker
through Postgres (`db.budget_pace.take_send_turn`). The slots of `services.rate_limit`
space a budget's activities; this is what keeps every window of sends within the
declared limit however late a sender woke (`protocol.rate_limit`'s docstring).

`services.remote.send`, the one sender, calls `take_turn` for every request whose step
names its budget (`LinkStep.turn`): POSTs, PATCHes, locator look-ups and read-backs.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import weakref
from dataclasses import dataclass

import asyncpg

from db.budget_pace import take_send_turn
from protocol.rate_limit import INTERACTIVE_PRIORITY, budget_key, window_wait_allowance
from services.logthrottle import ThrottledLog
from services.rate_limit import cached_send_window

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

# The shortest wait before asking again: a refusal read from a snapshot older than the
# send that filled the window answers 0 (`db.budget_pace.TAKE_SEND_TURN`).
MIN_RECHECK_S = 0.005


@dataclass(frozen=True)
class SendTurn:
    """Where a request takes its turn: the worker's pool and the remote scope it is sent
    to (with the profile's credential, which `remote.send` has, its budget)."""

    pool: asyncpg.Pool
    remote_scope: str
    # The Temporal priority its activity was scheduled with (lower first): a single save's
    # request waits ahead of its tenant's bulk `push` ones in this process's line (NF-8).
    rank: int = INTERACTIVE_PRIORITY


class Line:
    """A lock whose waiters are served by rank, then by arrival. asyncio's Lock is FIFO,
    and none of our dependencies has one by priority (a heap and a future per waiter)."""

    def __init__(self) -> None:
        self._held = False
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    async def acquire(self, rank: int) -> None:
        if not self._held and not self._waiters:
            self._held = True
            return
        place = asyncio.get_running_loop().create_future()
        entry = (rank, next(self._arrivals), place)
        heapq.heappush(self._waiters, entry)
        try:
            await place
        except BaseException:
            if place.done() and not place.cancelled():
                self.release()  # handed the line, then cancelled: hand it on
            elif entry in self._waiters:  # a release may already have dropped it
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
            raise

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def release(self) -> None:
        """Hand the line to the first waiter by rank and arrival (it stays held), or free it."""
        while self._waiters:
            place = heapq.heappop(self._waiters)[2]
            if not place.done():
                place.set_result(None)
                return
        self._held = False


async def take_turn(turn: SendTurn, credential_ref: str, deadline: float | None) -> bool:
    """Wait for this request's turn in its budget's send window and record it (NF-8').
    True: it may leave now (a budget no profile limits always may). False: no turn came
    while its activity (`deadline`, loop time) keeps a whole request timeout after it
    (G-7), or Postgres could not be asked: the request must not be sent (`not_sent`,
    which it provably is, rather than a journalled try with no outcome)."""
    try:
        return await _take_turn(turn, credential_ref, deadline)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as error:
        warn.warning("send window not reached (%s): not sent", type(error).__name__)
        return False


# One asker per budget in this process: requests refused a turn would otherwise all wake
# at the instant the window frees a place, one would take it and the rest ask again — a
# statement per waiter per send (P2 went from 3 to 39 transactions per create at a
# saturated budget). In line here, only the first asks; the others wait on the lock,
# with no statement and no pooled connection held, a single save's request ahead of its
# tenant's bulk ones (`Line`). (Per event loop: its futures belong to one loop.)
_in_line: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Line]] = (
    weakref.WeakKeyDictionary()
)


async def _take_turn(turn: SendTurn, credential_ref: str, deadline: float | None) -> bool:
    key = budget_key(turn.remote_scope, credential_ref)
    window = await cached_send_window(turn.pool, key)
    if window is None:
        return True
    loop = asyncio.get_running_loop()
    line = _in_line.setdefault(loop, {}).setdefault(key, Line())
    left = None if deadline is None else deadline - loop.time()
    try:
        async with asyncio.timeout(window_wait_allowance(left)):
            await line.acquire(turn.rank)
    except TimeoutError:
        warn.warning("remote budget %s: no send window turn in time; not sent", key)
        return False
    try:
        return await _ask_until_turn(turn, key, window.requests, window.span_s, deadline)
    finally:
        line.release()


async def _ask_until_turn(
    turn: SendTurn, key: str, requests: int, span_s: float, deadline: float | None
) -> bool:
    loop = asyncio.get_running_loop()
    while True:
        async with turn.pool.acquire() as conn:
            answer = await take_send_turn(conn, key, requests, span_s)
        if answer.sent_at is not None:
            return True
        wait = answer.wait_s
        left = None if deadline is None else deadline - loop.time()
        allowance = window_wait_allowance(left)
        if wait > allowance:
            warn.warning("remote budget %s: no send window turn in time; not sent", key)
            return False
        # Pacing: the window's turn is the condition, re-checked in Postgres above.
        await asyncio.sleep(max(wait, MIN_RECHECK_S))
