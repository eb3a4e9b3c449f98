"""What the worker runs: workflow classes and activity callables, listed once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import asyncpg
import httpx

from activities.action_callback import ActionCallbackActivities
from activities.inbound import InboundActivities
from activities.link import LinkActivities
from activities.link_ops import LinkOpsActivities
from activities.rate_limit import RateLimitActivities
from activities.relay import RelayActivities
from activities.retention import RetentionActivities
from protocol.action_callback import CallbackTarget
from services.dispatch_hooks import DispatchHooks
from workflows.action_callback import ActionCallbackWorkflow
from workflows.inbound import InboundEventWorkflow
from workflows.link import LinkWorkflow
from workflows.relay import RelayWorkflow
from workflows.retention import PruneWorkflow


def workflow_classes() -> Sequence[type]:
    """Every workflow class the `connector-push` task queue serves."""
    return [
        LinkWorkflow,
        InboundEventWorkflow,
        ActionCallbackWorkflow,
        RelayWorkflow,
        PruneWorkflow,
    ]


def activity_callables(
    pool: asyncpg.Pool,
    http: httpx.AsyncClient,
    hooks: DispatchHooks | None = None,
    callback_targets: Mapping[str, CallbackTarget] | None = None,
) -> Sequence[Callable[..., Any]]:
    """Activity methods bound to the shared pool and HTTP client; `callback_targets`: the
    workflow-action completion targets of the ingress policy, by endpoint (S-2)."""
    link = LinkActivities(pool, http, hooks)
    ops = LinkOpsActivities(pool, http, hooks)
    inbound = InboundActivities(pool)
    action = ActionCallbackActivities(pool, http, callback_targets)
    relay = RelayActivities(pool)
    budgets = RateLimitActivities(pool)
    retention = RetentionActivities(pool)
    return [
        inbound.classify_event,
        inbound.signal_remote_deleted,
        inbound.settle_event,
        action.load_execution,
        action.enqueue,
        action.observe,
        action.deliver,
        action.stop,
        link.dispatch_create,
        link.write_mirror,
        ops.dispatch_patch,
        ops.apply_operator_action,
        ops.apply_remote_evidence,
        ops.park_exhausted,
        relay.wake_links_with_pending_work,
        budgets.remote_budget,
        retention.prune_finished,
    ]
