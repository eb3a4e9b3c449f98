"""Retry policies of the link workflow's activities: a remote step's budget is bounded
(exhausted, the link parks for an operator); a local step retries until it lands."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from protocol.errors import NON_RETRYABLE_ERROR_TYPES

REMOTE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=8,
    non_retryable_error_types=sorted(NON_RETRYABLE_ERROR_TYPES),
)
LOCAL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=sorted(NON_RETRYABLE_ERROR_TYPES),
)
