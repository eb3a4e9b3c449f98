"""The strict modes' sliding window on a clock the test holds: no tolerance above the limit."""

from __future__ import annotations

import random

import pytest

from sandbox.config import RateLimitConfig
from sandbox.strict_limit import SandboxClock, SlidingWindow


class HeldClock(SandboxClock):
    """A clock that moves only when the test advances it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def window(requests: int, per_seconds: float = 10) -> tuple[SlidingWindow, HeldClock]:
    clock = HeldClock()
    return SlidingWindow(RateLimitConfig(requests=requests, per_seconds=per_seconds), clock), clock


def send(limiter: SlidingWindow, key: str = "a") -> bool:
    if limiter.wait(key) > 0:
        return False
    limiter.take(key)
    return True


def test_the_limit_plus_first_arrival_within_the_window_is_refused() -> None:
    limiter, clock = window(3)

    burst = [send(limiter) for _ in range(4)]
    clock.advance(9.999)
    still = send(limiter)
    wait_s = limiter.wait("a")
    clock.advance(0.001)  # the first arrival is now exactly 10 s old: out of the window

    assert burst == [True, True, True, False]
    assert still is False
    assert wait_s == pytest.approx(0.001)
    assert [send(limiter) for _ in range(4)] == [True, True, True, False]


def test_the_window_slides_instead_of_resetting() -> None:
    """A fixed 10 s window would admit three at t=10.5; the sliding one keeps t=5's."""
    limiter, clock = window(3)

    first = [send(limiter), send(limiter)]  # t=0
    clock.advance(5)
    middle = [send(limiter), send(limiter)]  # t=5: one fits
    clock.advance(5.5)
    late = [send(limiter) for _ in range(3)]  # t=10.5: t=0's two have left

    assert first == [True, True]
    assert middle == [True, False]
    assert late == [True, True, False]


def test_keys_are_independent() -> None:
    limiter, _ = window(2)

    a = [send(limiter, "a") for _ in range(3)]
    b = [send(limiter, "b") for _ in range(3)]

    assert a == b == [True, True, False]
    assert (limiter.used("a"), limiter.used("b")) == (2, 2)


@pytest.mark.parametrize("seed", range(20))
def test_exactly_the_limit_is_admitted_in_any_window(seed: int) -> None:
    """Any arrival pattern: no 10 s window holds more than the limit, and a refused
    arrival always had the full limit admitted in the 10 s before it."""
    rng = random.Random(seed)
    limit = rng.choice([1, 3, 20])
    limiter, clock = window(limit)
    admitted: list[float] = []
    for _ in range(400):
        clock.advance(rng.expovariate(limit / 8))  # about 25% over the limit on average
        if send(limiter):
            admitted.append(clock.now)
        else:
            assert sum(1 for t in admitted if t > clock.now - 10) == limit

    for start in admitted:
        assert sum(1 for t in admitted if start <= t < start + 10) <= limit
