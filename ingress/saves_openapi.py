"""The save API's OpenAPI 3.1 document, generated from its pydantic models (API-1)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from protocol.save_api import (
    BATCH_PATH,
    SAVE_PATH,
    BatchAnswer,
    ErrorAnswer,
    SaveAnswer,
    SaveApiPolicy,
    SaveBatchIn,
    SaveIn,
)

_REF = "#/components/schemas/{model}"
_MODELS: list[tuple[type[BaseModel], JsonSchemaMode]] = [
    (SaveIn, "validation"),
    (SaveBatchIn, "validation"),
    (SaveAnswer, "serialization"),
    (BatchAnswer, "serialization"),
    (ErrorAnswer, "serialization"),
]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _content(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


def _errors() -> dict[str, Any]:
    described = {
        "400": "invalid input, with field paths; nothing was written",
        "401": "missing or unknown bearer key",
        "403": (
            "a save outside the client's owners or users (`forbidden`), or of a record "
            "held for another owner or none (`record_owner_mismatch`); the whole request "
            "is refused, with the paths of the saves at fault, and nothing was written"
        ),
        "413": "body over the configured limit",
        "422": "Idempotency-Key reused with a different request",
        "503": "Postgres unavailable or deadline exceeded; retry after Retry-After",
    }
    return {
        code: {"description": text, "content": _content(ErrorAnswer)}
        for code, text in described.items()
    }


def _operation(summary: str, body: type[BaseModel], answer: type[BaseModel]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "parameters": [
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "description": (
                        "a repeat with the same key returns the first answer; "
                        "given more than once, the request is a 400"
                    ),
                    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                }
            ],
            "requestBody": {"required": True, "content": _content(body)},
            "responses": {
                "200": {
                    "description": "admission decided and committed",
                    "content": _content(answer),
                },
                **_errors(),
            },
        }
    }


def openapi_document(policy: SaveApiPolicy) -> dict[str, Any]:
    _, schemas = models_json_schema(_MODELS, ref_template=_REF)
    definitions = schemas.get("$defs", {})
    # The batch bound is the policy's (`max_batch`), not the model's: set where it applies.
    definitions[SaveBatchIn.__name__]["properties"]["saves"]["maxItems"] = policy.max_batch
    return {
        "openapi": "3.1.0",
        "info": {"title": "connector-push save API", "version": "1"},
        "paths": {
            SAVE_PATH: _operation("Report one record save", SaveIn, SaveAnswer),
            BATCH_PATH: _operation(
                f"Report up to {policy.max_batch} record saves", SaveBatchIn, BatchAnswer
            ),
        },
        "components": {
            "schemas": definitions,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
