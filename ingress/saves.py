"""The CRM's HTTP save API beside the ingress (SPEC API-1, API-2, WF-2).

`POST /v1/saves` (one save) and `POST /v1/saves/batch` (up to `max_batch`):
bearer key per client (401), bounded body (413), field-path validation (400,
nothing written), the client's scope and the records' owners (403, nothing written;
S-1), then one Postgres transaction admitting every save and storing
the answer under the client's `Idempotency-Key` — the 200 follows its commit.
Postgres unavailable or the deadline passed: 503 + Retry-After. Waking the
workflows comes after the commit, bounded by `wake_timeout_ms`; a wake-up that
does not happen is reported as deferred and the relay dispatches it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import asyncpg
from pydantic import SecretStr, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.client import Client

from db.save_api import IdempotencyClaim
from ingress.body import read_limited_body
from ingress.errors import Rejection
from ingress.saves_openapi import openapi_document
from protocol.admission import AdmissionDecision
from protocol.event_identity import JsonError, parse_exact_json
from protocol.save_api import (
    BATCH_PATH,
    OPENAPI_PATH,
    SAVE_PATH,
    BatchAnswer,
    ErrorAnswer,
    FieldProblem,
    SaveAnswer,
    SaveApiPolicy,
    SaveBatchIn,
    SaveIn,
    SaveResult,
    answer_for,
    record_owner_problems,
    request_hash,
    scope_problems,
)
from services.logthrottle import ThrottledLog
from services.save_entry import (
    BatchOutcome,
    IdempotencyConflict,
    WakeStatus,
    admit_batch,
    wake_best_effort,
)

log = logging.getLogger(__name__)
warn = ThrottledLog(log)  # a Temporal outage repeats one cause per save

RETRY_AFTER_S: Final = "5"
IDEMPOTENCY_HEADER: Final = "idempotency-key"
DEFERRED_WARNING: Final = (
    "wake-up deferred: the workflow could not be woken in time (Temporal or Postgres); "
    "the admission stands and the relay dispatches it"
)
_WAKE_CONCURRENCY: Final = 16

PoolSource = Callable[[], asyncpg.Pool]
TemporalSource = Callable[[], tuple[Client, str] | None]


class _BadRequest(Exception):
    def __init__(self, answer: ErrorAnswer, status: int = 400) -> None:
        super().__init__(answer.error)
        self.answer = answer
        self.status = status


def _json(content: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    body = content if isinstance(content, str) else json.dumps(content, separators=(",", ":"))
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def _error(status: int, error: str, headers: Mapping[str, str] | None = None) -> Response:
    return _json(ErrorAnswer(error=error).model_dump_json(), status, headers)


def _unavailable(reason: str) -> Response:
    return _error(503, reason, {"Retry-After": RETRY_AFTER_S})


def _problems(error: ValidationError, prefix: str = "") -> ErrorAnswer:
    fields = tuple(
        FieldProblem(path=prefix + ".".join(str(p) for p in e["loc"]), message=e["msg"])
        for e in error.errors(include_url=False, include_input=False)
    )
    return ErrorAnswer(error="invalid_request", fields=fields)


def _refuse_duplicate_keys(body: bytes) -> None:
    """A key given twice is refused, as on every ingress endpoint: pydantic's parser keeps
    the last value, so the save admitted could differ from the one a reader sees."""
    try:
        parse_exact_json(body)
    except JsonError as error:  # the body validated: a duplicate key is all this can find
        problem = FieldProblem(path="", message=str(error))
        raise _BadRequest(ErrorAnswer(error="invalid_request", fields=(problem,))) from None


def parse_single(body: bytes, policy: SaveApiPolicy) -> list[SaveIn]:
    try:
        save = SaveIn.model_validate_json(body)
    except ValidationError as error:
        raise _BadRequest(_problems(error)) from None
    _refuse_duplicate_keys(body)
    return [save]


def parse_batch(body: bytes, policy: SaveApiPolicy) -> list[SaveIn]:
    try:
        batch = SaveBatchIn.model_validate_json(body)
    except ValidationError as error:
        raise _BadRequest(_problems(error)) from None
    _refuse_duplicate_keys(body)
    if len(batch.saves) > policy.max_batch:
        problem = FieldProblem(path="saves", message=f"at most {policy.max_batch} saves")
        raise _BadRequest(ErrorAnswer(error="batch_too_large", fields=(problem,)))
    return batch.saves


Parser = Callable[[bytes, SaveApiPolicy], list[SaveIn]]


class SaveApi:
    """The save routes; the pool and the Temporal client come from the app's lifespan."""

    def __init__(
        self,
        policy: SaveApiPolicy,
        keys: Mapping[str, SecretStr],
        pool: PoolSource,
        temporal: TemporalSource,
    ) -> None:
        self._policy = policy
        self._clients = {c.name: c for c in policy.clients}
        self._keys = [(name, key.get_secret_value().encode()) for name, key in keys.items()]
        self._pool = pool
        self._temporal = temporal
        self._openapi = json.dumps(openapi_document(policy), separators=(",", ":"))

    def routes(self) -> list[Route]:
        return [
            Route(SAVE_PATH, self._endpoint(SAVE_PATH, parse_single), methods=["POST"]),
            Route(BATCH_PATH, self._endpoint(BATCH_PATH, parse_batch), methods=["POST"]),
            Route(OPENAPI_PATH, self.openapi, methods=["GET"]),
        ]

    async def openapi(self, request: Request) -> Response:
        return _json(self._openapi)

    def _client_of(self, request: Request) -> str | None:
        """The client whose bearer key was presented; every key is compared (constant time)."""
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return None
        found = None
        for name, key in self._keys:
            if hmac.compare_digest(presented.encode(), key):
                found = name
        return found

    def _endpoint(self, route: str, parse: Parser) -> Callable[[Request], object]:
        async def endpoint(request: Request) -> Response:
            client = self._client_of(request)
            if client is None:
                return _error(401, "unauthorized", {"WWW-Authenticate": "Bearer"})
            return await self._answer(request, client, route, parse)

        return endpoint

    async def _answer(self, request: Request, client: str, route: str, parse: Parser) -> Response:
        try:
            async with asyncio.timeout(self._policy.deadline_ms / 1000):
                saves, outcome = await self._admit(request, client, route, parse)
        except Rejection as rejection:
            return _error(rejection.status, rejection.reason)
        except _BadRequest as bad:
            return _json(bad.answer.model_dump_json(), bad.status)
        except IdempotencyConflict:
            return _error(422, "idempotency_key_reused")
        except TimeoutError:
            log.warning("save API: deadline exceeded")
            return _unavailable("deadline_exceeded")
        except Exception as exc:  # Postgres down or failing: retryable, never a 500
            log.warning("save API admission failed: %s", type(exc).__name__)
            return _unavailable("database_unavailable")
        return await self._respond(route, saves, outcome)

    async def _admit(
        self, request: Request, client: str, route: str, parse: Parser
    ) -> tuple[list[SaveIn], BatchOutcome]:
        body = await read_limited_body(request, self._policy.body_limit)
        saves = parse(body, self._policy)
        prefix = "saves." if route == BATCH_PATH else ""
        # S-1: a client saves only for its owners (and listed users); one save outside
        # refuses the whole request, before anything is written (fail closed: a batch
        # admitted in part would answer for saves the client had no right to make).
        _refuse(client, scope_problems(self._clients[client], saves, prefix))
        claim = _claim(request, client, request_hash(route, saves))

        def render(decisions: list[AdmissionDecision]) -> str:
            return _render(route, _results(saves, decisions))

        def check_owners(owners: Mapping[tuple[str, str], str | None]) -> None:
            _refuse(client, record_owner_problems(saves, owners, prefix))

        requests = [s.to_save_request() for s in saves]
        outcome = await admit_batch(self._pool(), requests, render, claim, check_owners)
        return saves, outcome

    async def _respond(self, route: str, saves: list[SaveIn], outcome: BatchOutcome) -> Response:
        if outcome.decisions is None:  # a repeat: the first answer, nothing admitted
            results = _stored_results(route, outcome.body)
            return _json(_render(route, results, replayed=True), 200, _REPLAYED)
        wakes = await self._wake(saves, outcome.decisions)
        results = [
            r.model_copy(update={"wake": w.value})
            for r, w in zip(_results(saves, outcome.decisions), wakes, strict=True)
        ]
        warnings = (DEFERRED_WARNING,) if WakeStatus.DEFERRED in wakes else ()
        return _json(_render(route, results, warnings=warnings))

    async def _wake(
        self, saves: Sequence[SaveIn], decisions: Sequence[AdmissionDecision]
    ) -> list[WakeStatus]:
        """Signal-with-start each admitted save's workflow, all within `wake_timeout_ms`;
        whatever has not answered by then is deferred to the relay."""
        temporal = self._temporal()
        client, task_queue = temporal if temporal is not None else (None, "")
        timeout_s = self._policy.wake_timeout_ms / 1000
        gate = asyncio.Semaphore(_WAKE_CONCURRENCY)

        async def wake(save: SaveIn, decision: AdmissionDecision) -> WakeStatus:
            async with gate:
                return await wake_best_effort(
                    client,
                    task_queue,
                    decision,
                    save.save_id,
                    timeout_s,
                    pool=self._pool(),
                    save=save.to_save_request(),
                )

        tasks = [asyncio.create_task(wake(s, d)) for s, d in zip(saves, decisions, strict=True)]
        await asyncio.wait(tasks, timeout=timeout_s)
        for task in tasks:
            task.cancel()
        return [_wake_status(t) for t in tasks]


def _wake_status(task: asyncio.Task[WakeStatus]) -> WakeStatus:
    """What a wake-up came to; unfinished, or failed in any way, it is deferred to the relay
    (the saves are committed: the answer says so, never a 500)."""
    if not task.done() or task.cancelled():
        return WakeStatus.DEFERRED
    if (error := task.exception()) is not None:
        warn.warning("wake-up deferred to the relay: %s", type(error).__name__)
        return WakeStatus.DEFERRED
    return task.result()


_REPLAYED: Final = {"Idempotent-Replayed": "true"}


def _claim(request: Request, client: str, digest: str) -> IdempotencyClaim | None:
    keys = request.headers.getlist(IDEMPOTENCY_HEADER)
    if not keys:
        return None
    if len(keys) > 1:  # which one the client meant is a guess: refused, nothing written
        raise _bad_idempotency_key("given once only; this request has it more than once")
    [key] = keys
    if not 1 <= len(key) <= 255 or not key.isascii() or not key.isprintable():
        raise _bad_idempotency_key("1 to 255 printable ASCII characters")
    return IdempotencyClaim(client_id=client, key=key, request_hash=digest)


def _refuse(client: str, refusal: ErrorAnswer | None) -> None:
    """403 with the reason (S-1); logged by client and paths, never the values."""
    if refusal is None:
        return
    paths = ", ".join(problem.path for problem in refusal.fields)
    log.warning("save API: client %s refused (%s): %s", client, refusal.error, paths)
    raise _BadRequest(refusal, 403)


def _bad_idempotency_key(message: str) -> _BadRequest:
    problem = FieldProblem(path="header:Idempotency-Key", message=message)
    return _BadRequest(ErrorAnswer(error="invalid_request", fields=(problem,)))


def _results(saves: Sequence[SaveIn], decisions: Sequence[AdmissionDecision]) -> list[SaveResult]:
    return [answer_for(s, d) for s, d in zip(saves, decisions, strict=True)]


def _render(
    route: str,
    results: Sequence[SaveResult],
    *,
    replayed: bool = False,
    warnings: tuple[str, ...] = (),
) -> str:
    """The answer's JSON: one `result` on /v1/saves, `results` on the batch route."""
    answer: SaveAnswer | BatchAnswer = (
        SaveAnswer(result=results[0], replayed=replayed, warnings=warnings)
        if route == SAVE_PATH
        else BatchAnswer(results=tuple(results), replayed=replayed, warnings=warnings)
    )
    return answer.model_dump_json(by_alias=True, exclude_none=True)


def _stored_results(route: str, body: str) -> list[SaveResult]:
    if route == SAVE_PATH:
        return [SaveAnswer.model_validate_json(body).result]
    return list(BatchAnswer.model_validate_json(body).results)
