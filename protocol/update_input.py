"""Lenient decoding of operator update input (WF-3).

The Temporal UI sends whatever JSON an operator typed. Decoding it straight into
the typed model fails before the validator runs ("Failed decoding arguments"),
so the updates take any JSON value and this module validates it, naming every
bad or missing field in one line.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, JsonValue, ValidationError

from protocol.messages import OperatorInput

InputT = TypeVar("InputT", bound=OperatorInput)

# What an update handler accepts: the typed model (the CLI) or any JSON (the UI).
UpdatePayload = OperatorInput | JsonValue


class UpdateInputError(ValueError):
    """The update's input is not what the update takes; the message names each field."""


def parse_update_input(model: type[InputT], raw: object, example: dict[str, object]) -> InputT:
    """`raw` as `model`: a model instance, a JSON object, or JSON text of one."""
    if isinstance(raw, model):
        return raw
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    if isinstance(raw, str):
        raw = _json_text(raw, example)
    if not isinstance(raw, dict):
        raise UpdateInputError(f"expected a JSON object like {_compact(example)}")
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        raise UpdateInputError(_fields(error, example)) from None


def _json_text(text: str, example: dict[str, object]) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise UpdateInputError(f"expected a JSON object like {_compact(example)}") from None


def _fields(error: ValidationError, example: dict[str, object]) -> str:
    problems = []
    for item in error.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"]) or "input"
        if item["type"] == "missing":
            problems.append(f"missing field {field!r}")
        elif item["type"] == "extra_forbidden":
            problems.append(f"unknown field {field!r}")
        else:
            problems.append(f"field {field!r}: {item['msg']}")
    return "; ".join(problems) + f" (expected {_compact(example)})"


def _compact(example: dict[str, object]) -> str:
    return json.dumps(example, separators=(", ", ": "))
