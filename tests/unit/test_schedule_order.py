"""The long tests are dealt to the heads of the worksteal shares (tests/fixtures/schedule.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests.fixtures.schedule import deal


@dataclass
class Marker:
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class FakeItem:
    name: str
    seconds: float | None = None

    def get_closest_marker(self, name: str) -> Marker | None:
        if name != "slow" or self.seconds is None:
            return None
        return Marker({"seconds": self.seconds})


def names(items: list[pytest.Item]) -> list[str]:
    return [cast(FakeItem, item).name for item in items]


def test_each_share_starts_with_its_long_tests_longest_first() -> None:
    items = [FakeItem(f"t{i}") for i in range(10)]
    items[3] = FakeItem("long30", 30)
    items[7] = FakeItem("long90", 90)
    items[9] = FakeItem("long60", 60)
    ordered = names(deal(cast(list[pytest.Item], items), workers=2))
    assert sorted(ordered) == sorted(item.name for item in items)
    first, second = ordered[:5], ordered[5:]  # worksteal's two contiguous shares of 10
    assert first[:2] == ["long90", "long30"]
    assert second[0] == "long60"
    short = [name for name in ordered if not name.startswith("long")]
    assert short == sorted(short, key=lambda name: int(name[1:]))  # their order kept


def test_without_long_tests_the_order_is_untouched() -> None:
    items = cast(list[pytest.Item], [FakeItem(f"t{i}") for i in range(5)])
    assert deal(items, workers=3) == items
