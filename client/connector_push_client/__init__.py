"""A Python client for the HTTP save API (SPEC API-1), for CRMs outside the worker's process.

    async with SaveApiClient("https://connector.example", api_key) as api:
        answer = await api.save(SaveIn(ownerKey=..., ...), idempotency_key="save-123")
        print(answer.result.decision, answer.result.link_key)

Pass the same `idempotency_key` when retrying a request whose answer was lost: the
server returns the first answer and admits nothing new. A 503 (Postgres down) is
raised as `SaveApiError` with `retry_after` set; retry with the same key. What the
server would refuse with a 400 (a padded or empty id, a control character, an over-long
id or batch, a malformed idempotency key) is refused here, before any request, with
pydantic's `ValidationError`.

Installed alone with `pip install ./client` (httpx and pydantic only; see client/README.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self

from pydantic import ValidationError

from connector_push_client.models import (
    BATCH_PATH,
    MAX_BATCH,
    SAVE_PATH,
    BatchAnswer,
    ErrorAnswer,
    FieldProblem,
    SaveAnswer,
    SaveBatchIn,
    SaveIn,
    SaveResult,
    check_idempotency_key,
)

if TYPE_CHECKING:
    import httpx

# The server's default `save_api.max_batch`; pass the policy's own if it sets another.
DEFAULT_BATCH: Final = 100

__all__ = [
    "MAX_BATCH",
    "BatchAnswer",
    "FieldProblem",
    "SaveAnswer",
    "SaveApiClient",
    "SaveApiError",
    "SaveIn",
    "SaveResult",
]


class SaveApiError(Exception):
    """A non-200 answer: `status`, the server's `error`, field problems and Retry-After."""

    def __init__(
        self,
        status: int,
        error: str,
        fields: Sequence[FieldProblem] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {error}")
        self.status = status
        self.error = error
        self.fields = tuple(fields)
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status == 503


def _error_of(response: httpx.Response) -> SaveApiError:
    try:
        answer = ErrorAnswer.model_validate_json(response.content)
    except ValidationError:
        answer = ErrorAnswer(error=response.reason_phrase or "unexpected answer")
    retry_after = response.headers.get("retry-after")
    seconds = float(retry_after) if retry_after and retry_after.isdigit() else None
    return SaveApiError(response.status_code, answer.error, answer.fields, seconds)


async def _each(saves: Iterable[SaveIn] | AsyncIterable[SaveIn]) -> AsyncIterator[SaveIn]:
    if isinstance(saves, AsyncIterable):
        async for save in saves:
            yield save
    else:
        for save in saves:
            yield save


class SaveApiClient:
    """Reports saves over HTTP with a bearer key; owns its httpx client unless given one."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 10.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        # Imported here, not above: `protocol` takes its wire models from this package and
        # must stay free of httpx (its purity contract), even at runtime.
        import httpx

        self._owned = http is None
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout_s)
        self._headers = {"authorization": f"Bearer {api_key}"}

    async def save(self, save: SaveIn, idempotency_key: str | None = None) -> SaveAnswer:
        """Report one save; returns its committed admission decision."""
        body = save.model_dump_json(by_alias=True, exclude_none=True)
        response = await self._post(SAVE_PATH, body, idempotency_key)
        return SaveAnswer.model_validate_json(response.content)

    async def save_batch(
        self, saves: Sequence[SaveIn], idempotency_key: str | None = None
    ) -> BatchAnswer:
        """Report several saves in one transaction; results are in request order."""
        body = SaveBatchIn(saves=tuple(saves)).model_dump_json(by_alias=True, exclude_none=True)
        response = await self._post(BATCH_PATH, body, idempotency_key)
        return BatchAnswer.model_validate_json(response.content)

    async def save_all(
        self,
        saves: Iterable[SaveIn] | AsyncIterable[SaveIn],
        *,
        batch_size: int = DEFAULT_BATCH,
        idempotency_prefix: str | None = None,
    ) -> AsyncIterator[BatchAnswer]:
        """Report every save of `saves` (a list, a generator, an async iterator over a
        million records) as batches of `batch_size` (at most the server's `max_batch`),
        one request at a time, yielding each batch's answer. At most one batch is held in
        memory: the iterator is read only as fast as batches are sent.

        With `idempotency_prefix`, batch n is sent with the key `<prefix>-<n>`: after a
        crash or Ctrl-C, run it again over the same saves in the same order with the same
        prefix and the batches already admitted are answered from their stored first
        answer (`replayed`), admitting nothing twice (API-1)."""
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be from 1 to {MAX_BATCH}")
        if idempotency_prefix is not None:
            check_idempotency_key(f"{idempotency_prefix}-0")
        batch: list[SaveIn] = []
        number = 0
        async for save in _each(saves):
            batch.append(save)
            if len(batch) == batch_size:
                yield await self._send(batch, idempotency_prefix, number)
                batch, number = [], number + 1
        if batch:
            yield await self._send(batch, idempotency_prefix, number)

    async def _send(self, batch: list[SaveIn], prefix: str | None, number: int) -> BatchAnswer:
        return await self.save_batch(batch, None if prefix is None else f"{prefix}-{number}")

    async def _post(self, path: str, body: str, idempotency_key: str | None) -> httpx.Response:
        headers = {**self._headers, "content-type": "application/json"}
        if idempotency_key is not None:
            headers["idempotency-key"] = check_idempotency_key(idempotency_key)
        response = await self._http.post(path, content=body, headers=headers)
        if response.status_code != 200:
            raise _error_of(response)
        return response

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
