"""The lifecycle tables against the seeds' status tables, transcribed here by hand
(issue 15; seed 000 "Remote Link State", "Create Attempt State"; SPEC §4 PAT; seed 004 /
SPEC ING-6 events). Deliberately not imported from `protocol/states.py`: an edge added
to (or dropped from) the protocol tables fails here, and `tests/db/test_transitions.py`
holds the database triggers to the protocol tables, so neither can drift from the seeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import pytest

from protocol.states import LIFECYCLES

# seed 000, "Remote Link State": state -> allowed next states.
SEED_LINK = {
    "finalized": {"suspended_drift", "retired"},
    "suspended_drift": {"finalized", "retired"},  # finalized after explicit revalidation
    "retired": set(),
}

# seed 000, "Create Attempt State".
SEED_ATTEMPT = {
    "pending": {"processing", "terminal_failed"},
    "processing": {
        "post_sent",
        "writeback_pending",
        "ambiguous_remote_effect",
        "terminal_failed",
        "pending",  # after lease expiry
    },
    "post_sent": {"writeback_pending", "ambiguous_remote_effect", "terminal_failed"},
    "ambiguous_remote_effect": {"writeback_pending"},  # explicit reconciliation only
    "writeback_pending": {"finalized", "terminal_failed"},
    "finalized": set(),
    "terminal_failed": {"superseded"},  # explicit operator/migration policy only
    "superseded": set(),
}

# SPEC §4 PAT: pending -> processing -> {succeeded, ambiguous_remote_effect, failed,
# pending (lease lost, checkpoint null)}; pending|failed -> superseded.
SEED_PATCH = {
    "pending": {"processing", "superseded"},
    "processing": {"succeeded", "ambiguous_remote_effect", "failed", "pending"},
    "succeeded": set(),
    "ambiguous_remote_effect": set(),
    "failed": {"superseded"},
    "superseded": set(),
}

# seed 004 / SPEC ING-6: each admitted event ends processed, skipped or dead.
SEED_EVENT = {
    "admitted": {"processed", "skipped", "dead"},
    "processed": set(),
    "skipped": set(),
    "dead": set(),
}

SEED: dict[str, tuple[dict[str, set[str]], str]] = {
    "link": (SEED_LINK, "finalized"),  # "There is no pending remote-link state."
    "attempt": (SEED_ATTEMPT, "pending"),
    "patch": (SEED_PATCH, "pending"),
    "event": (SEED_EVENT, "admitted"),
}


def as_strings(table: Mapping[StrEnum, frozenset[StrEnum]]) -> dict[str, set[str]]:
    return {source.value: {target.value for target in targets} for source, targets in table.items()}


@pytest.mark.parametrize("lifecycle", sorted(SEED))
def test_the_protocol_table_is_the_seed_table(lifecycle: str) -> None:
    _, states, table, initial = LIFECYCLES[lifecycle]
    seed_table, seed_initial = SEED[lifecycle]
    assert {s.value for s in states} == set(seed_table), "states differ from the seed"
    assert as_strings(table) == seed_table
    assert initial.value == seed_initial


def test_every_lifecycle_is_transcribed() -> None:
    assert set(LIFECYCLES) == set(SEED)
