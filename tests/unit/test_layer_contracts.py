"""The import contracts (pyproject.toml) keep their shape as modules come and go (STYLE 16).

import-linter cannot say "every workflows module but one", so the contract letting
services import `workflows.search_attributes` lists the others; these tests keep that
list complete, and keep the contracts free of exceptions.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARED_WITH_STARTERS = "search_attributes"


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _workflow_modules() -> set[str]:
    return {
        f"workflows.{path.stem}"
        for path in (ROOT / "workflows").glob("*.py")
        if path.stem not in {"__init__", SHARED_WITH_STARTERS}
    }


def test_services_may_import_no_workflows_module_but_the_search_attributes() -> None:
    (contract,) = [
        c
        for c in _contracts()
        if c["source_modules"] == ["services"]
        and any(m.startswith("workflows.") for m in c["forbidden_modules"])
    ]
    listed = {m for m in contract["forbidden_modules"] if m.startswith("workflows.")}
    assert listed == _workflow_modules()


def test_no_contract_carries_an_exception() -> None:
    assert [c["name"] for c in _contracts() if c.get("ignore_imports")] == []


def test_services_reach_neither_activities_nor_a_composition_root() -> None:
    (contract,) = [
        c
        for c in _contracts()
        if c["source_modules"] == ["services"] and "activities" in c["forbidden_modules"]
    ]
    assert {"activities", "worker", "ingress", "cli", "sandbox"} <= set(
        contract["forbidden_modules"]
    )
    assert not contract.get("allow_indirect_imports")
