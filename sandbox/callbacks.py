"""Workflow-action callback completions: record what arrived, answer like the automation API."""

from __future__ import annotations

from pydantic import JsonValue

from sandbox.config import SandboxConfig
from sandbox.holder import StateHolder, now_iso
from sandbox.replies import Rejected, Reply, error, parse_json_object
from sandbox.state import CallbackCompletion


class CallbackInbox:
    """Receives single and batch completions and keeps every one, duplicates included."""

    def __init__(self, config: SandboxConfig, holder: StateHolder) -> None:
        self._config = config
        self._holder = holder

    def complete(self, callback_id: str, raw: bytes) -> Reply:
        """`POST …/callbacks/{callbackId}/complete` with `{"outputFields": {...}}`."""
        try:
            output_fields = _output_fields(parse_json_object(raw))
        except Rejected as rejected:
            return rejected.reply
        duplicate = self._receive(callback_id, output_fields, batch=False)
        self._holder.commit()
        return Reply(self._config.callback_duplicate_status if duplicate else 204)

    def complete_batch(self, raw: bytes) -> Reply:
        """`POST …/callbacks/complete` with `{"inputs": [{"callbackId", "outputFields"}]}`."""
        try:
            inputs = _batch_inputs(parse_json_object(raw))
        except Rejected as rejected:
            return rejected.reply
        for callback_id, output_fields in inputs:
            self._receive(callback_id, output_fields, batch=True)
        self._holder.commit()
        return Reply(204)

    def received(self) -> list[CallbackCompletion]:
        """Every completion received, in arrival order."""
        return list(self._holder.state.callbacks)

    def _receive(self, callback_id: str, output_fields: dict[str, JsonValue], batch: bool) -> bool:
        callbacks = self._holder.state.callbacks
        duplicate = any(c.callback_id == callback_id for c in callbacks)
        completion = CallbackCompletion(
            seq=len(callbacks) + 1,
            at=now_iso(),
            callback_id=callback_id,
            output_fields=output_fields,
            batch=batch,
            duplicate=duplicate,
        )
        callbacks.append(completion)
        return duplicate


def _output_fields(doc: dict[str, JsonValue]) -> dict[str, JsonValue]:
    output_fields = doc.get("outputFields")
    if not isinstance(output_fields, dict):
        raise Rejected(error(400, "VALIDATION_ERROR", "outputFields must be an object"))
    return output_fields


def _batch_inputs(doc: dict[str, JsonValue]) -> list[tuple[str, dict[str, JsonValue]]]:
    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise Rejected(error(400, "VALIDATION_ERROR", "inputs must be a list"))
    return [_batch_input(item) for item in inputs]


def _batch_input(item: JsonValue) -> tuple[str, dict[str, JsonValue]]:
    callback_id = item.get("callbackId") if isinstance(item, dict) else None
    if not isinstance(item, dict) or not isinstance(callback_id, str) or not callback_id:
        raise Rejected(error(400, "VALIDATION_ERROR", "each input needs a callbackId"))
    return callback_id, _output_fields(item)
