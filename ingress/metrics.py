"""The bounded ack-drop reason counter (ING-2): labels are configured endpoints x `DropReason`."""

from __future__ import annotations

from collections import Counter

from ingress.errors import DropReason


class DropCounter:
    def __init__(self, endpoints: frozenset[str]) -> None:
        self._endpoints = endpoints
        self._counts: Counter[tuple[str, DropReason]] = Counter()

    def increment(self, endpoint: str, reason: DropReason) -> None:
        if endpoint in self._endpoints:  # never a label from request data
            self._counts[(endpoint, reason)] += 1

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
        return "\n".join(lines) + "\n"
