"""SPEC §17 S-6 (a remote's answer is bounded: size, nesting, `Retry-After`; a remote id of
`.` or `..` is refused) and G-7 (one deadline per request, from the activity's time left)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from protocol.answer_bounds import (
    MAX_ANSWER_BYTES,
    MAX_ANSWER_DEPTH,
    bounded_retry_after,
    nesting_exceeds,
    too_large,
)
from protocol.remote_ids import RemoteIdError, check_remote_id, is_canonical
from protocol.timeouts import (
    REMOTE_HTTP_TIMEOUT,
    REQUEST_DEADLINE_MARGIN,
    activity_time_left,
    request_deadline_s,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("raw", [".", "..", " ..", ".\t"])
def test_s6_dot_segments_are_not_remote_ids(raw: str) -> None:
    with pytest.raises(RemoteIdError, match="path segment") as refused:
        check_remote_id(raw)
    assert refused.value.canonical is None
    assert not is_canonical(raw)


def test_s6_ids_with_dots_in_them_are_still_ids() -> None:
    for raw in ("...", ".a", "a.b", "1001"):
        assert check_remote_id(raw) == raw


def test_s6_a_deep_body_is_refused_by_a_scan_not_a_recursive_parser() -> None:
    deep = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(RecursionError):
        json.loads(deep)  # what reading it used to do
    assert nesting_exceeds(deep)
    limit = b"[" * MAX_ANSWER_DEPTH + b"]" * MAX_ANSWER_DEPTH
    assert not nesting_exceeds(limit)
    assert nesting_exceeds(b"[" + limit + b"]")


def test_s6_brackets_inside_strings_do_not_count() -> None:
    quoted = json.dumps({"note": "[" * 500 + '\\"{' * 100, "ok": [[1]]}).encode()
    assert not nesting_exceeds(quoted)


def test_s6_a_declared_length_over_the_cap_is_refused_unread() -> None:
    assert too_large(str(MAX_ANSWER_BYTES + 1))
    assert too_large("9" * 40)
    assert not too_large(str(MAX_ANSWER_BYTES))
    assert not too_large(None) and not too_large("nonsense")


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("20", "20"),
        ("900", "900"),
        ("901", "900"),
        ("86400000000", "900"),
        ("9" * 400, "900"),  # a float overflow: infinity
        (format_datetime(NOW + timedelta(days=3), usegmt=True), "900"),
        (format_datetime(NOW + timedelta(seconds=30), usegmt=True), None),  # as sent
        ("soon", "soon"),  # unreadable: the caller's default delay
    ],
)
def test_s6_retry_after_is_capped(sent: str, kept: str | None) -> None:
    assert bounded_retry_after(sent, NOW, 900.0) == (kept or sent)


def test_g7_one_deadline_is_the_request_timeout_or_the_activity_time_left() -> None:
    limit = REMOTE_HTTP_TIMEOUT.total_seconds()
    margin = REQUEST_DEADLINE_MARGIN.total_seconds()
    assert request_deadline_s(None) == limit
    assert request_deadline_s(30.0) == limit
    assert request_deadline_s(5.0) == pytest.approx(5.0 - margin)
    assert request_deadline_s(margin) <= 0  # no time left to record an answer: not sent


def test_g7_activity_time_left_counts_from_the_try_start() -> None:
    start_to_close = timedelta(seconds=30)
    assert activity_time_left(start_to_close, NOW, NOW + timedelta(seconds=12)) == 18.0
    # The server's clock ahead of ours counts nothing spent; far behind, everything.
    assert activity_time_left(start_to_close, NOW, NOW - timedelta(seconds=5)) == 30.0
    assert activity_time_left(start_to_close, NOW, NOW + timedelta(hours=1)) == 0.0
