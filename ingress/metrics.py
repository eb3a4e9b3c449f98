"""The ingress's bounded counters (ING-2): ack-drop reasons (configured endpoints x
`DropReason`) and the retryable 503s answered per endpoint (the status view's 503s)."""

from __future__ import annotations

from collections import Counter

from ingress.errors import DropReason


class DropCounter:
    def __init__(self, endpoints: frozenset[str], answering: frozenset[str] = frozenset()) -> None:
        self._endpoints = endpoints  # ack-drop capable (webhooks)
        self._answering = endpoints | answering  # every endpoint that may answer 503
        self._counts: Counter[tuple[str, DropReason]] = Counter()
        self._unavailable: Counter[str] = Counter()

    def increment(self, endpoint: str, reason: DropReason) -> None:
        if endpoint in self._endpoints:  # never a label from request data
            self._counts[(endpoint, reason)] += 1

    def unavailable(self, endpoint: str) -> None:
        """One retryable 503 answered on `endpoint` (a configured name, never request data)."""
        if endpoint in self._answering:
            self._unavailable[endpoint] += 1

    def count(self, endpoint: str, reason: DropReason) -> int:
        return self._counts[(endpoint, reason)]

    def render(self) -> str:
        """Prometheus text exposition."""
        lines = ["# TYPE connector_push_ingress_ack_drop_total counter"]
        for (endpoint, reason), value in sorted(self._counts.items()):
            lines.append(
                f'connector_push_ingress_ack_drop_total{{endpoint="{endpoint}",'
                f'reason="{reason.value}"}} {value}'
            )
        lines.append("# TYPE connector_push_ingress_unavailable_total counter")
        for endpoint, value in sorted(self._unavailable.items()):
            lines.append(
                f'connector_push_ingress_unavailable_total{{endpoint="{endpoint}"}} {value}'
            )
        return "\n".join(lines) + "\n"
