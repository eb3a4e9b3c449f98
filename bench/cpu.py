"""Where a bench round's CPU goes: seconds per component of the stack, read from /proc.

P1 compares two rates on one two-core machine, so what limits either rate is CPU, and
the report says whose: the Temporal server, Postgres (every backend, including ones that
exited), the sandbox remote, or this process (the CRM entry, the worker and the SDK's
core threads). Linux only; elsewhere the split is simply not reported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SELF = "crm_and_worker"  # this process: the CRM entry, the worker, the SDK's core threads


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children), or None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / TICKS


def _tree_seconds(
    root: int, children: Mapping[int, list[int]], seconds: Mapping[int, float]
) -> float:
    """The root's CPU plus every live descendant's (exited ones are in a parent's reaped
    time once waited for, as Postgres's postmaster does for its backends)."""
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += seconds.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


def cpu_seconds(roots: Mapping[str, int], own: bool = True) -> dict[str, float] | None:
    """CPU seconds so far of each named process tree, and (`own`) of this process under
    `SELF`; None where /proc cannot be read."""
    if not (PROC / "self" / "stat").exists():
        return None
    children: dict[int, list[int]] = {}
    seconds: dict[int, float] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parent, seconds[int(entry.name)] = stat
            children.setdefault(parent, []).append(int(entry.name))
    times = os.times()
    result = {name: _tree_seconds(pid, children, seconds) for name, pid in roots.items()}
    if own:
        result[SELF] = times.user + times.system  # not its children: the stack's servers
    return result


def ms_per_unit(
    before: Mapping[str, float] | None, after: Mapping[str, float] | None, units: int
) -> dict[str, float]:
    """Milliseconds of CPU per unit of work (create, workflow) by component."""
    if before is None or after is None or units <= 0:
        return {}
    return {name: round(1000 * (after[name] - before[name]) / units, 1) for name in after}


def describe(split: Mapping[str, float]) -> str:
    """'temporal 26.9, postgres 6.1, ... (total 56.0) ms'"""
    if not split:
        return "CPU split not available"
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in split.items())
    return f"{parts} (total {sum(split.values()):.1f}) ms"
