"""How a request ends early: fail-closed rejections and mode-dependent unavailability."""

from __future__ import annotations

from enum import StrEnum


class DropReason(StrEnum):
    """Bounded reasons for internal failures (the ack-drop metric's label set)."""

    DEADLINE_EXCEEDED = "deadline_exceeded"
    DATABASE_UNAVAILABLE = "database_unavailable"
    ADMISSION_FAILED = "admission_failed"
    OVER_CAPACITY = "over_capacity"  # more than `max_connections` connections open


class Rejection(Exception):
    """A security or protocol failure: fail closed, the same in every mode (ING-3)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Unavailable(Exception):
    """An internal failure: 503 + Retry-After on `retry`, 204 on `ack_drop` (ING-2)."""

    def __init__(self, reason: DropReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


# The one named internal 503 that no mode turns into an acknowledgement (ING-3).
REQUEST_URI_RESOLVE_FAILED = "request_uri_resolve_failed"


# The ASGI scope extension the server's protocol (ingress/server.py) sets on a request
# that arrived with more than `max_connections` connections open; the app answers it at
# once with the endpoint's internal-failure answer (ING-2).
OVER_CAPACITY_EXTENSION = "connector_push.over_capacity"
