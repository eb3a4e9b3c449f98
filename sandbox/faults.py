"""Fault rules: which request a fault hits (method, path, nth or seeded probability) and what."""

from __future__ import annotations

import fnmatch
import random
import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

FaultAction = Literal[
    "delay_ms",
    "status",
    "reset_before_effect",
    "reset_after_effect",
    "hang_after_effect",
    "drip_after_effect",
]
# The largest answer body a `status` rule may be padded to (S-6 tests send over 1 MiB).
MAX_FAULT_BODY_BYTES = 16 * 1024 * 1024


class FaultRuleSpec(BaseModel):
    """A rule as posted to `/_sandbox/faults`; `delay_ms` is applied before any action.

    `drip_after_effect` applies the request, then sends its answer's status line and
    headers at once and its body one byte every `drip_ms` (a slow, healthy remote: each
    read is quick, the whole answer is not). A `status` rule's body may be padded to
    `body_bytes` bytes or nested `body_depth` levels deep instead of `body` (S-6)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = "*"
    path: str
    path_syntax: Literal["glob", "regex"] = "glob"
    nth: int | None = Field(default=None, ge=1)
    probability: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    times: int | None = Field(default=None, ge=1)
    action: FaultAction
    delay_ms: int = Field(default=0, ge=0, le=600_000)
    status: int | None = Field(default=None, ge=100, le=599)
    retry_after: str | None = None
    body: JsonValue = None
    hang_ms: int = Field(default=30_000, ge=0, le=600_000)
    drip_ms: int = Field(default=1_000, ge=1, le=60_000)
    body_bytes: int | None = Field(default=None, ge=2, le=MAX_FAULT_BODY_BYTES)
    body_depth: int | None = Field(default=None, ge=1, le=1_000_000)

    @field_validator("retry_after", mode="before")
    @classmethod
    def _retry_after_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) else value

    @model_validator(mode="after")
    def _consistent(self) -> FaultRuleSpec:
        if self.nth is not None and self.probability is not None:
            raise ValueError("give nth or probability, not both")
        if self.action == "status" and self.status is None:
            raise ValueError("action 'status' needs a status")
        if self.body_bytes is not None and self.body_depth is not None:
            raise ValueError("give body_bytes or body_depth, not both")
        if self.path_syntax == "regex":
            _check_regex(self.path)
        return self


def _check_regex(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid path regex: {exc}") from exc


class FaultRuleView(FaultRuleSpec):
    """A rule as listed: its id and how often it matched and fired."""

    id: int
    matched: int
    fired: int


@dataclass
class _ArmedRule:
    id: int
    spec: FaultRuleSpec
    rng: random.Random
    matched: int = 0
    fired: int = 0
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        source = self.spec.path
        if self.spec.path_syntax == "glob":
            source = fnmatch.translate(source)
        self.pattern = re.compile(source)

    def matches(self, method: str, path: str) -> bool:
        wanted = self.spec.method.upper()
        return wanted in ("*", method.upper()) and self.pattern.fullmatch(path) is not None

    def wants_to_fire(self) -> bool:
        # Always draw, so a rule's random sequence never depends on other rules.
        self.matched += 1
        draw = self.rng.random()
        spec = self.spec
        if spec.times is not None and self.fired >= spec.times:
            return False
        if spec.nth is not None:
            return self.matched == spec.nth
        return spec.probability is None or draw < spec.probability

    def view(self) -> FaultRuleView:
        counters = {"id": self.id, "matched": self.matched, "fired": self.fired}
        return FaultRuleView.model_validate({**self.spec.model_dump(), **counters})


class FaultBook:
    """The active rules, in insertion order; each has its own seeded `random.Random`."""

    def __init__(self, default_seed: int) -> None:
        self._default_seed = default_seed
        self._rules: list[_ArmedRule] = []
        self._next_id = 1

    def add(self, spec: FaultRuleSpec) -> FaultRuleView:
        """Arm a rule; without its own seed it is seeded from the config seed and its id."""
        rule_id, self._next_id = self._next_id, self._next_id + 1
        seed = spec.seed if spec.seed is not None else f"{self._default_seed}:{rule_id}"
        rule = _ArmedRule(id=rule_id, spec=spec, rng=random.Random(seed))
        self._rules.append(rule)
        return rule.view()

    def rules(self) -> list[FaultRuleView]:
        """Every rule with its counters."""
        return [rule.view() for rule in self._rules]

    def clear(self) -> None:
        """Drop every rule and restart rule ids at 1."""
        self._rules.clear()
        self._next_id = 1

    def pick(self, method: str, path: str) -> FaultRuleSpec | None:
        """Count the request against every matching rule; return the first that fires."""
        chosen: _ArmedRule | None = None
        for rule in self._rules:
            if rule.matches(method, path) and rule.wants_to_fire() and chosen is None:
                chosen = rule
        if chosen is None:
            return None
        chosen.fired += 1
        return chosen.spec
