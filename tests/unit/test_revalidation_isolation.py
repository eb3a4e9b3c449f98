"""SPEC §9 REV-3: bulk revalidation has no path to remote callouts, local records or attempt
mutation: the modules its entry points import, followed to the end, never reach them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = (
    "services.revalidation",
    "services.revalidation_plan",
    "services.revalidation_owner",
    "db.revalidation",
    "protocol.revalidation",
)
FORBIDDEN = (
    "httpx",
    "temporalio",
    "services.remote",
    "services.record_store",
    "services.record_loader",
    "activities.link",
    "services.create",
    "services.patch",
    "services.mirror",
    "services.admission",
    "db.links",
    "db.patches",
)


def _imports(module: str) -> set[tuple[str, tuple[str, ...]]]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    found: set[tuple[str, tuple[str, ...]]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name, ()) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add((node.module, tuple(alias.name for alias in node.names)))
    return found


def _closure() -> set[str]:
    """Our modules the entry points reach; db.records is allowed only for the `Conn` alias."""
    ours = ("protocol", "db", "activities", "services")
    seen: set[str] = set()
    todo = list(ENTRY_POINTS)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name, names in _imports(module):
            if name == "db" and names:
                name = f"db.{names[0]}"
            if name == "db.records":
                assert names == ("Conn",), f"{module} imports {names} from db.records"
                continue
            if name.split(".")[0] in ours:
                todo.append(name)
            else:
                seen.add(name)
    return seen


def test_revalidation_cannot_reach_remote_records_or_attempt_mutation() -> None:
    reached = _closure()
    assert not {m for m in reached if m.startswith(FORBIDDEN)}
