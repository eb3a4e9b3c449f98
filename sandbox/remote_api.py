"""The HubSpot-shaped routes: CRM objects and workflow-action callback completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandbox.callbacks import CallbackInbox
from sandbox.rate_limit import RateLimiter
from sandbox.replies import Reply
from sandbox.store import ObjectStore

OBJECTS = "/crm/v3/objects/{object_type}"
CALLBACKS = "/automation/v4/actions/callbacks"


def to_response(reply: Reply) -> Response:
    """Turn a `Reply` into a Starlette response (no body for `None`)."""
    if reply.body is None:
        return Response(status_code=reply.status, headers=dict(reply.headers))
    return JSONResponse(reply.body, reply.status, dict(reply.headers))


def remote_routes(store: ObjectStore, inbox: CallbackInbox, limiter: RateLimiter) -> list[Route]:
    """Routes of the emulated remote API; object requests count against the rate limit."""

    async def create(request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        object_type = request.path_params["object_type"]
        body = await request.body()
        return _limited(request) or to_response(store.create(object_type, body, key))

    async def read(request: Request) -> Response:
        object_type, ref = _address(request)
        id_property = request.query_params.get("idProperty")
        return _limited(request) or to_response(store.read(object_type, ref, id_property))

    async def patch(request: Request) -> Response:
        object_type, ref = _address(request)
        if_match = request.headers.get("if-match")
        body = await request.body()
        return _limited(request) or to_response(store.patch(object_type, ref, body, if_match))

    async def delete(request: Request) -> Response:
        return _limited(request) or to_response(store.delete(*_address(request)))

    def _limited(request: Request) -> Response | None:
        # A 429 is a refusal before processing: the store never sees the request.
        refusal = limiter.admit(request.method, request.path_params["object_type"])
        return None if refusal is None else to_response(refusal)

    async def complete(request: Request) -> Response:
        callback_id = request.path_params["callback_id"]
        return to_response(inbox.complete(callback_id, await request.body()))

    async def complete_batch(request: Request) -> Response:
        return to_response(inbox.complete_batch(await request.body()))

    return [
        Route(OBJECTS, create, methods=["POST"]),
        Route(OBJECTS + "/{object_ref}", read, methods=["GET"]),
        Route(OBJECTS + "/{object_ref}", patch, methods=["PATCH"]),
        Route(OBJECTS + "/{object_ref}", delete, methods=["DELETE"]),
        Route(CALLBACKS + "/complete", complete_batch, methods=["POST"]),
        Route(CALLBACKS + "/{callback_id}/complete", complete, methods=["POST"]),
    ]


def _address(request: Request) -> tuple[str, str]:
    return request.path_params["object_type"], request.path_params["object_ref"]
