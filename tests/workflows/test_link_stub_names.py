"""The control-flow tests' stubs stand for real activities (issue 48 item 2): each stub's
name and input type are those of the activity the worker registers under that name, so
a renamed activity fails here at once instead of leaving a stubbed workflow waiting."""

from __future__ import annotations

import inspect
from typing import Any

from temporalio import activity

from activities.link import LinkActivities
from activities.link_ops import LinkOpsActivities
from activities.rate_limit import RateLimitActivities
from tests.workflows.link_stubs import StubActivities


def _definitions(cls: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for _, member in inspect.getmembers(cls, inspect.isfunction):
        definition = activity._Definition.from_callable(member)
        if definition is not None:
            found[definition.name] = member
    return found


def test_every_stub_is_a_registered_activity_with_the_same_input() -> None:
    real = {
        **_definitions(LinkActivities),
        **_definitions(LinkOpsActivities),
        **_definitions(RateLimitActivities),
    }
    stubs = _definitions(StubActivities)
    assert stubs, "no stubs found"
    for name, stub in stubs.items():
        assert name in real, f"stub {name!r} names no real activity"
        stub_input = list(inspect.signature(stub).parameters.values())[1].annotation
        real_input = list(inspect.signature(real[name]).parameters.values())[1].annotation
        assert stub_input == real_input, f"{name}: {stub_input} is not {real_input}"
