"""The workflow helpers passed through the sandbox hold no state of their own (issue 16).

Passing a module through shares one copy between every workflow run in the worker;
that is safe only for a module whose globals nothing can change. These helpers were
passed through because the sandbox re-imported them for every new run (a third of the
worker's time per create, profiled); this test fails if one grows a mutable global.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from worker.runtime import PASSTHROUGH_MODULES

HELPERS = [m for m in PASSTHROUGH_MODULES if m.startswith("workflows.")]
MUTABLE = (dict, list, set, bytearray)


def _defined_elsewhere(module: types.ModuleType, value: object) -> bool:
    """True when `value` is some other loaded module's global (imported, not defined here)."""
    return any(
        other is not module and any(v is value for v in vars(other).values())
        for other in list(sys.modules.values())
        if isinstance(other, types.ModuleType) and other.__name__.startswith("protocol")
    )


def test_the_workflow_run_module_itself_is_not_passed_through() -> None:
    assert HELPERS, "the helpers passed through are listed in worker.runtime"
    assert "workflows" not in PASSTHROUGH_MODULES
    assert "workflows.link" not in PASSTHROUGH_MODULES


@pytest.mark.parametrize("name", HELPERS)
def test_a_passed_through_workflow_helper_defines_no_mutable_global(name: str) -> None:
    module = importlib.import_module(name)
    own = {
        key: type(value).__name__
        for key, value in vars(module).items()
        if not key.startswith("__")
        and isinstance(value, MUTABLE)
        and not _defined_elsewhere(module, value)
    }
    assert own == {}, f"{name} defines mutable globals shared by every run: {own}"
