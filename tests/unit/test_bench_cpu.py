"""bench.cpu: a component's CPU is its whole process tree, live and reaped (issue 16, P1's
CPU split): Postgres's backends are the postmaster's children, and many have exited by
the time a round ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import cpu
from bench.cpu import SELF, cpu_seconds, describe, ms_per_unit

BURN_S = 0.4
BURN = f"""
import time
end = time.process_time() + {BURN_S}
while time.process_time() < end:
    pass
"""

# A parent that burns nothing itself: one child burns and exits (reaped by the parent),
# another burns and stays alive until the parent's stdin closes.
PARENT = textwrap.dedent(
    f"""
    import subprocess, sys
    BURN = {BURN!r}
    subprocess.run([sys.executable, "-c", BURN], check=True)
    live = subprocess.Popen(
        [sys.executable, "-c", BURN + "print('burned', flush=True)\\nimport sys; sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    live.stdout.readline()
    print("ready", flush=True)
    sys.stdin.read()
    live.stdin.close()
    live.wait()
    """
)


def test_a_tree_counts_its_live_and_its_reaped_descendants() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdin is not None and parent.stdout is not None
        try:
            assert parent.stdout.readline().strip() == "ready"
            seconds = cpu_seconds({"tree": parent.pid})
        finally:
            parent.stdin.close()  # the parent and its live child exit
        assert parent.wait(timeout=30) == 0
    assert seconds is not None
    # Each burner alone is BURN_S; missing either kind of descendant stays under 2x.
    assert seconds["tree"] >= 2 * BURN_S
    assert SELF in seconds


def test_a_gone_root_counts_nothing() -> None:
    seconds = cpu_seconds({"gone": 2**22 + 7})  # above any pid_max default in use
    assert seconds is not None and seconds["gone"] == 0.0


def test_no_proc_means_no_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "PROC", tmp_path)  # a machine without /proc
    before = cpu_seconds({"temporal": 1})
    assert before is None
    assert ms_per_unit(before, before, 10) == {}


def test_milliseconds_per_unit_and_their_line() -> None:
    split = ms_per_unit({"temporal": 1.0, SELF: 2.0}, {"temporal": 1.5, SELF: 2.25}, 100)
    assert split == {"temporal": 5.0, SELF: 2.5}
    assert describe(split) == f"temporal 5.0, {SELF} 2.5 (total 7.5) ms"
    assert ms_per_unit(None, {"temporal": 1.0}, 10) == {}
    assert describe({}) == "CPU split not available"
