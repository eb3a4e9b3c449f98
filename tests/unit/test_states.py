"""Transition tables: reachability from the initial state, terminal states have no exits."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import pytest

from protocol.states import LIFECYCLES, ProtocolError, check_transition, transition_pairs


def reachable(table: Mapping[StrEnum, frozenset[StrEnum]], start: StrEnum) -> set[StrEnum]:
    seen, frontier = {start}, [start]
    while frontier:
        for nxt in table[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


@pytest.mark.parametrize("name", sorted(LIFECYCLES))
def test_every_state_reachable_from_initial(name: str) -> None:
    _, enum, table, initial = LIFECYCLES[name]
    assert reachable(table, initial) == set(enum)


@pytest.mark.parametrize("name", sorted(LIFECYCLES))
def test_table_covers_every_state_and_terminal_states_have_no_exits(name: str) -> None:
    _, enum, table, _ = LIFECYCLES[name]
    assert set(table) == set(enum)
    terminal = {s for s in enum if not table[s]}
    assert terminal, f"{name} has no terminal state"
    for state in terminal:
        for target in enum:
            with pytest.raises(ProtocolError, match=name):
                check_transition(name, table, state, target)


@pytest.mark.parametrize("name", sorted(LIFECYCLES))
def test_check_transition_is_exactly_the_table(name: str) -> None:
    _, enum, table, _ = LIFECYCLES[name]
    legal = set(transition_pairs(table))
    for source in enum:
        for target in enum:
            if (source, target) in legal:
                check_transition(name, table, source, target)
            else:
                with pytest.raises(ProtocolError):
                    check_transition(name, table, source, target)
