"""S-6 at the workflow-action completion: the wait a remote's `Retry-After` asks for is read
as every answer's is (delta-seconds or an HTTP-date) and capped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx

from services.action_callback import CALLBACK_RETRY_AFTER_CAP_S, callback_retry_delay


def _answer(retry_after: str | None) -> httpx.Response:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return httpx.Response(503, headers=headers)


def test_delta_seconds_are_kept_below_the_cap() -> None:
    assert callback_retry_delay(_answer("7")) == timedelta(seconds=7)


def test_a_huge_wait_is_capped() -> None:
    cap = timedelta(seconds=CALLBACK_RETRY_AFTER_CAP_S)
    assert callback_retry_delay(_answer("86400000000")) == cap


def test_an_http_date_is_a_wait_too() -> None:
    """Was: only digits were read, so a date fell back to the retry policy's backoff."""
    when = datetime.now(UTC) + timedelta(seconds=120)
    delay = callback_retry_delay(_answer(format_datetime(when, usegmt=True)))
    assert delay is not None and timedelta(seconds=100) < delay <= timedelta(seconds=120)


def test_no_header_or_garbage_leaves_the_backoff_to_the_policy() -> None:
    assert callback_retry_delay(_answer(None)) is None
    assert callback_retry_delay(_answer("soon")) is None
    assert callback_retry_delay(None) is None
