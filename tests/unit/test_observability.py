"""NF-1: structured log lines carry correlation ids and never a secret."""

from __future__ import annotations

import json
import logging

import pytest

from services.log_format import JsonFormatter, redact
from worker.settings import RuntimeSettings


def record(message: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("cp", logging.INFO, __file__, 1, message, None, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_json_line_carries_link_key_attempt_and_workflow_ids() -> None:
    line = json.loads(
        JsonFormatter().format(
            record("claimed", link_key="lk1_x", attempt_id="a-1", workflow_id="link/lk1_x")
        )
    )
    assert line["msg"] == "claimed"
    assert (line["link_key"], line["attempt_id"], line["workflow_id"]) == (
        "lk1_x",
        "a-1",
        "link/lk1_x",
    )


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connect postgresql://app:hunter2@db:5432/cp failed", "hunter2"),
        ("api_key=sk-live-123 rejected", "sk-live-123"),
        ('{"password": "pa55"}', "pa55"),
        ("Authorization: Bearer tok-9", "tok-9"),
    ],
)
def test_secrets_are_masked_in_messages_and_tracebacks(text: str, secret: str) -> None:
    assert secret not in redact(text)
    try:
        raise RuntimeError(text)
    except RuntimeError:
        rec = record("failed: " + text)
        rec.exc_info = __import__("sys").exc_info()
    assert secret not in JsonFormatter().format(rec)


def test_settings_never_print_their_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:hunter2@db/cp")
    monkeypatch.setenv("TEMPORAL_API_KEY", "tk-secret")
    settings = RuntimeSettings()
    shown = repr(settings) + str(settings.model_dump())
    assert "hunter2" not in shown and "tk-secret" not in shown
    assert settings.require_database_url().endswith("@db/cp")
