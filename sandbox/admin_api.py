"""The `/_sandbox` admin routes: health, reset, faults, ledger, callbacks, objects, rate limit."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import JsonValue, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandbox.callbacks import CallbackInbox
from sandbox.faults import FaultBook, FaultRuleSpec
from sandbox.holder import StateHolder
from sandbox.rate_limit import RateLimiter, RateLimitSettings
from sandbox.store import ObjectStore

ADMIN = "/_sandbox"


def admin_routes(
    holder: StateHolder,
    book: FaultBook,
    store: ObjectStore,
    inbox: CallbackInbox,
    limiter: RateLimiter,
) -> list[Route]:
    """The generous mode's routes for tests and benchmarks to steer and inspect it."""

    async def age_keys(request: Request) -> Response:
        seconds = float(request.query_params.get("seconds", "0"))
        return JSONResponse({"keys": store.age_keys(seconds)})

    return [
        *core_admin_routes(holder, book, store.list_objects, limiter.reset),
        *callback_routes(inbox),
        Route(ADMIN + "/idempotency/age", age_keys, methods=["POST"]),
        *_rate_limit_routes(limiter),
    ]


def core_admin_routes(
    holder: StateHolder,
    book: FaultBook,
    objects: Callable[[str], list[JsonValue]],
    reset_limits: Callable[[], None],
) -> list[Route]:
    """Every mode's admin routes: health, reset, faults, ledger and stored objects."""

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def reset(request: Request) -> Response:
        holder.reset()
        book.clear()
        reset_limits()
        return Response(status_code=204)

    async def add_fault(request: Request) -> Response:
        try:
            spec = FaultRuleSpec.model_validate_json(await request.body())
        except ValidationError as exc:
            return JSONResponse({"status": "error", "message": str(exc)}, 422)
        return JSONResponse(book.add(spec).model_dump(mode="json"), 201)

    async def list_faults(request: Request) -> Response:
        return JSONResponse({"rules": [r.model_dump(mode="json") for r in book.rules()]})

    async def clear_faults(request: Request) -> Response:
        book.clear()
        return Response(status_code=204)

    async def ledger(request: Request) -> Response:
        wanted = _filter(request, "object_type", "kind")
        entries = [e.model_dump(mode="json") for e in holder.state.ledger]
        return JSONResponse({"entries": [e for e in entries if wanted(e)]})

    async def list_objects(request: Request) -> Response:
        return JSONResponse({"results": objects(request.path_params["object_type"])})

    return [
        Route(ADMIN + "/health", health, methods=["GET"]),
        Route(ADMIN + "/reset", reset, methods=["POST"]),
        Route(ADMIN + "/faults", add_fault, methods=["POST"]),
        Route(ADMIN + "/faults", list_faults, methods=["GET"]),
        Route(ADMIN + "/faults", clear_faults, methods=["DELETE"]),
        Route(ADMIN + "/ledger", ledger, methods=["GET"]),
        Route(ADMIN + "/objects/{object_type}", list_objects, methods=["GET"]),
    ]


def callback_routes(inbox: CallbackInbox) -> list[Route]:
    """The workflow-action callback completions received (generous and hubspot modes)."""

    async def callbacks(request: Request) -> Response:
        received = [c.model_dump(mode="json") for c in inbox.received()]
        return JSONResponse({"completions": received})

    return [Route(ADMIN + "/callbacks", callbacks, methods=["GET"])]


def _rate_limit_routes(limiter: RateLimiter) -> list[Route]:
    async def report(request: Request) -> Response:
        return JSONResponse(limiter.report().model_dump(mode="json"))

    async def configure(request: Request) -> Response:
        try:
            settings = RateLimitSettings.model_validate_json(await request.body())
        except ValidationError as exc:
            return JSONResponse({"status": "error", "message": str(exc)}, 422)
        limiter.configure(settings)
        return JSONResponse(settings.model_dump(mode="json"))

    return [
        Route(ADMIN + "/rate-limit", report, methods=["GET"]),
        Route(ADMIN + "/rate-limit", configure, methods=["PUT"]),
    ]


def _filter(request: Request, *names: str) -> Callable[[dict[str, object]], bool]:
    # Query parameters named like entry fields must equal them; others are ignored.
    wanted = {n: request.query_params[n] for n in names if n in request.query_params}
    return lambda entry: all(str(entry.get(n)) == v for n, v in wanted.items())
