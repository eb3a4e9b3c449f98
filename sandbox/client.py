"""A typed async client for the sandbox admin API, for tests and benchmarks."""

from __future__ import annotations

import httpx
from pydantic import TypeAdapter

from sandbox.config import HubSpotLimits, SalesforceLimits
from sandbox.faults import FaultRuleSpec, FaultRuleView
from sandbox.front_door import ClockAdvance, GateReport, LockSetting
from sandbox.rate_limit import RateLimitReport, RateLimitSettings
from sandbox.state import CallbackCompletion, LedgerEntry, LedgerKind

_RULES = TypeAdapter(list[FaultRuleView])
_ENTRIES = TypeAdapter(list[LedgerEntry])
_COMPLETIONS = TypeAdapter(list[CallbackCompletion])


class SandboxClient:
    """Admin calls against one sandbox; the caller owns `http` and closes it."""

    def __init__(self, base_url: str, http: httpx.AsyncClient) -> None:
        self._base = base_url.rstrip("/") + "/_sandbox"
        self._http = http

    async def add_fault(self, rule: FaultRuleSpec) -> FaultRuleView:
        """Arm a fault rule; returns it with its id."""
        response = await self._http.post(f"{self._base}/faults", content=rule.model_dump_json())
        return FaultRuleView.model_validate_json(response.raise_for_status().content)

    async def faults(self) -> list[FaultRuleView]:
        """Armed rules with their matched/fired counters."""
        response = await self._http.get(f"{self._base}/faults")
        return _RULES.validate_python(response.raise_for_status().json()["rules"])

    async def clear_faults(self) -> None:
        """Drop every fault rule."""
        (await self._http.delete(f"{self._base}/faults")).raise_for_status()

    async def ledger(
        self, object_type: str | None = None, kind: LedgerKind | None = None
    ) -> list[LedgerEntry]:
        """Ledger entries in order, optionally only one object type and/or kind."""
        params = {k: v for k, v in (("object_type", object_type), ("kind", kind)) if v}
        response = await self._http.get(f"{self._base}/ledger", params=params)
        return _ENTRIES.validate_python(response.raise_for_status().json()["entries"])

    async def callbacks(self) -> list[CallbackCompletion]:
        """Callback completions received, in arrival order."""
        response = await self._http.get(f"{self._base}/callbacks")
        return _COMPLETIONS.validate_python(response.raise_for_status().json()["completions"])

    async def objects(self, object_type: str) -> list[dict[str, object]]:
        """Every stored object of a type, HubSpot-shaped."""
        response = await self._http.get(f"{self._base}/objects/{object_type}")
        results: list[dict[str, object]] = response.raise_for_status().json()["results"]
        return results

    async def age_idempotency_keys(self, seconds: float) -> int:
        """Make every stored idempotency key `seconds` older (G-5: the remote forgets keys
        after its TTL); how many keys the sandbox holds."""
        response = await self._http.post(
            f"{self._base}/idempotency/age", params={"seconds": seconds}
        )
        keys: int = response.raise_for_status().json()["keys"]
        return keys

    async def rate_limit(self) -> RateLimitReport:
        """The limits in force, 429s answered per object type and every admitted request."""
        response = await self._http.get(f"{self._base}/rate-limit")
        return RateLimitReport.model_validate_json(response.raise_for_status().content)

    async def set_rate_limit(self, settings: RateLimitSettings) -> None:
        """Replace the rate limits (buckets start full)."""
        body = settings.model_dump_json()
        (await self._http.put(f"{self._base}/rate-limit", content=body)).raise_for_status()

    async def limits(self) -> GateReport:
        """A strict mode's limits, lock, refusals by reason and every admitted request."""
        response = await self._http.get(f"{self._base}/limits")
        return GateReport.model_validate_json(response.raise_for_status().content)

    async def set_limits(self, limits: HubSpotLimits | SalesforceLimits) -> None:
        """Replace a strict mode's limits (windows start empty)."""
        body = limits.model_dump_json()
        (await self._http.put(f"{self._base}/limits", content=body)).raise_for_status()

    async def set_locked(self, locked: bool) -> None:
        """Lock a strict mode's remote (every request refused as locked) or unlock it."""
        body = LockSetting(locked=locked).model_dump_json()
        (await self._http.put(f"{self._base}/lock", content=body)).raise_for_status()

    async def advance_clock(self, seconds: float) -> None:
        """Move a strict mode's clock forward, as if `seconds` passed for its limits."""
        body = ClockAdvance(seconds=seconds).model_dump_json()
        (await self._http.post(f"{self._base}/clock", content=body)).raise_for_status()

    async def reset(self) -> None:
        """Forget objects, ledger, idempotency records, callbacks, faults and rate-limit counts."""
        (await self._http.post(f"{self._base}/reset")).raise_for_status()
