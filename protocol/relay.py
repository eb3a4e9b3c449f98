"""Inputs and results of the relay sweep (SPEC WF-2), one model per workflow and activity."""

from __future__ import annotations

from pydantic import Field

from protocol.messages import Message


class RelayInput(Message):
    """One sweep. `min_age_seconds`: leave rows younger than this to their own wake-up."""

    min_age_seconds: float = Field(default=30.0, ge=0)
    page_size: int = Field(default=200, ge=1, le=1000)


class RelayPageInput(Message):
    """A page of link keys after `after` (keyset paging, so no row starves the rest)."""

    after: str | None = None
    limit: int = Field(ge=1, le=1000)
    min_age_seconds: float = Field(ge=0)


class RelayPageResult(Message):
    woken: int
    last_key: str | None = None  # None: the sweep is complete


class RelayResult(Message):
    woken: int
    pages: int
    complete: bool  # False when the page budget ran out; the next sweep continues
