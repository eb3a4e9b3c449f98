"""The local stack's settings as the CLI's defaults, where there is a local stack.

In a checkout (the editable dev install) a command given no `$DATABASE_URL` or
`$TEMPORAL_ADDRESS` talks to `make dev`'s stack, at the addresses in `temporal-dev.yaml`.
An installed wheel has no local stack (`cli.stack` is not in it) and no such file:
there the variable is required, and its absence is one line naming it (exit 5).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cli.stack.devconfig import DevConfig


def has_local_stack() -> bool:
    """True in a checkout's dev install: the dev stack and the sandbox remote importable."""
    return all(importlib.util.find_spec(name) is not None for name in ("cli.stack", "sandbox"))


def local_stack_config() -> DevConfig | None:
    """`temporal-dev.yaml`, or None where the dev stack is not installed (a wheel)."""
    if importlib.util.find_spec("cli.stack") is None:
        return None
    from cli.stack.devconfig import DEFAULT_PATH, load_dev_config

    return load_dev_config() if DEFAULT_PATH.exists() else None
