"""The remote HTTP client's per-request cost that an install can leave behind (issue 16).

httpcore asks which event loop it runs on (`current_async_library`) four times per
request, by importing sniffio inside the function. Without sniffio installed each call is
a failed import that searches every `sys.path` entry again.
"""

from __future__ import annotations

import sys

import httpcore._synchronization as httpcore_sync
import pytest


async def test_httpcore_finds_its_event_loop_without_an_import_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    searched: list[str] = []

    class Recorder:
        """A meta-path finder that only notes which modules the import system looks for."""

        @staticmethod
        def find_spec(name: str, *args: object) -> None:
            searched.append(name)

    monkeypatch.setattr(sys, "meta_path", [Recorder(), *sys.meta_path])

    assert httpcore_sync.current_async_library() == "asyncio"
    assert httpcore_sync.current_async_library() == "asyncio"

    assert searched == []
