"""The small `responseIdPath` dialect: `$` followed by `.key` and `[index]` steps."""

from __future__ import annotations

import re
from typing import Final

from pydantic import JsonValue

_STEP: Final = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]")

Step = str | int


class UnsupportedResponseIdPath(ValueError):
    """A `responseIdPath` outside the supported dialect."""


def parse_id_path(path: str) -> tuple[Step, ...]:
    """Parse `$.id`, `$.results[0].id`, `$.data.object.id`; anything else raises."""
    if not path.startswith("$") or path == "$":
        raise UnsupportedResponseIdPath(
            f"{path!r}: expected '$' followed by .key or [index] steps, e.g. '$.id'"
        )
    steps: list[Step] = []
    position = 1
    while position < len(path):
        match = _STEP.match(path, position)
        if match is None:
            raise UnsupportedResponseIdPath(
                f"{path!r}: unsupported syntax at offset {position}; "
                "only .key and [index] steps are allowed"
            )
        key, index = match.groups()
        steps.append(key if key is not None else int(index))
        position = match.end()
    return tuple(steps)


def _child(node: JsonValue, step: Step) -> tuple[bool, JsonValue]:
    """(found, value) for one step into `node`."""
    if isinstance(step, str):
        if isinstance(node, dict) and step in node:
            return True, node[step]
        return False, None
    if isinstance(node, list) and step < len(node):
        return True, node[step]
    return False, None


def extract_id(body: JsonValue, path: str) -> str | None:
    """The remote id at `path`: a non-empty string or an integer, else None."""
    node: JsonValue = body
    for step in parse_id_path(path):
        found, node = _child(node, step)
        if not found:
            return None
    if isinstance(node, bool):
        return None
    if isinstance(node, int):
        return str(node)
    if isinstance(node, str) and node.strip() == node and node:
        return node
    return None
