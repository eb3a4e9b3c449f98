"""Ordinary webhooks: per-event identity and receipts, one admission commit (ING-1, ING-5)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from db.ingress_queries import EventRow, ReceiptRow
from ingress.body import parse_document
from ingress.errors import Rejection
from protocol.event_identity import (
    MISSING,
    IdentityError,
    canonical_decimal,
    dump_exact_json,
    identities,
    lookup,
)
from protocol.ingress_policy import InboundRoute, WebhookEndpoint


@dataclass
class AdmissionPlan:
    events: list[EventRow] = field(default_factory=list)
    receipts: list[ReceiptRow] = field(default_factory=list)
    correlations: list[dict[str, str | None]] = field(default_factory=list)


def parse_batch(endpoint: WebhookEndpoint, body: bytes) -> list[Mapping[str, object]]:
    """The body's events under `BATCH_RULE`: a bare object is `batch_not_array` (400)."""
    events = parse_document(body)
    if not isinstance(events, list):
        raise Rejection(400, "batch_not_array")
    if not events or len(events) > endpoint.max_events:
        raise Rejection(400, "bad_batch_size")
    objects = [event for event in events if isinstance(event, Mapping)]
    if len(objects) != len(events):
        raise Rejection(400, "event_not_object")
    return objects


def _attempt_text(endpoint: WebhookEndpoint, event: Mapping[str, object]) -> str | None:
    path = endpoint.identity.attempt_path
    value = MISSING if path is None else lookup(event, path)
    return canonical_decimal(value) if isinstance(value, Decimal) else None


def remote_object_id(route: InboundRoute, event: Mapping[str, object]) -> str | None:
    """The remote object's id as the remote writes it (`1001`, not `1001.0`), or None."""
    value = lookup(event, route.object_id_path)
    if isinstance(value, Decimal) and value.is_finite():
        integral = value == value.to_integral_value() and abs(value) < 10**30
        return str(int(value)) if integral else format(value, "f")
    return value if isinstance(value, str) and value else None


def remote_scope(route: InboundRoute, event: Mapping[str, object]) -> str | None:
    """The links' remote scope for the event's account, or None when it is not mapped."""
    if route.scope_path is None:
        return None
    value = lookup(event, route.scope_path)
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        value = str(int(value))
    return route.remote_scopes.get(value) if isinstance(value, str) else None


def _add_event(
    plan: AdmissionPlan, endpoint: WebhookEndpoint, event: Mapping[str, object], request_id: str
) -> None:
    try:
        event_id, receipt_id = identities(endpoint.identity, endpoint.name, event)
    except IdentityError:
        raise Rejection(400, "unidentifiable_event") from None
    event_type = lookup(event, endpoint.event_type_field)
    if not isinstance(event_type, str):
        raise Rejection(400, "missing_event_type")
    route = endpoint.routes.get(event_type)
    payload = dump_exact_json(event)
    routed_id = event_id if route is not None else None
    plan.receipts.append(
        ReceiptRow(
            receipt_id,
            endpoint.name,
            request_id,
            routed_id,
            event_type,
            _attempt_text(endpoint, event),
            payload,
        )
    )
    if route is not None:
        plan.events.append(
            EventRow(
                event_id,
                endpoint.name,
                event_type,
                route.handler.value,
                payload,
                receipt_id,
                route.target_object,
                remote_object_id(route, event),
                remote_scope(route, event),
            )
        )
    plan.correlations.append({"receiptId": receipt_id, "eventId": routed_id})


def plan_admission(endpoint: WebhookEndpoint, body: bytes, request_id: str) -> AdmissionPlan:
    """Identify every event of a verified body; rejects the whole body if any event is bad."""
    plan = AdmissionPlan()
    for event in parse_batch(endpoint, body):
        _add_event(plan, endpoint, event, request_id)
    return plan
