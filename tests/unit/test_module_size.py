"""No Python module over 400 lines (issue 31): a module that grows past it is split by
concern, not by "utils"."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
# Modules that hold one concept and stay whole, each with why (issue 48): split one of
# these only along a concept of its own, never to get under the line count.
ALLOWED: dict[str, str] = {
    "protocol/manifest.py": "the pack schema: every model a manifest declares, and the "
    "cross-reference checks its validators run; a model split from its validator could "
    "be built without it",
}
# Not ours: the virtualenv, and caches or build output that may hold copies.
SKIPPED = frozenset({".venv", ".git", "build", "__pycache__", "node_modules"})


def line_counts(root: Path) -> dict[str, int]:
    """Lines of every .py file under `root`, outside `SKIPPED` folders, by relative path."""
    counts: dict[str, int] = {}
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if SKIPPED.isdisjoint(relative.parts[:-1]):
            counts[relative.as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return counts


def oversized(counts: dict[str, int]) -> list[str]:
    return [
        f"{name} ({n} lines)"
        for name, n in sorted(counts.items())
        if n > MAX_LINES and name not in ALLOWED
    ]


def test_no_module_is_over_400_lines() -> None:
    offenders = oversized(line_counts(ROOT))
    assert not offenders, f"split by concern (max {MAX_LINES} lines): " + ", ".join(offenders)


def test_the_check_names_an_oversized_module(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "pkg" / "small.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "vendored.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(line_counts(tmp_path)) == [f"pkg/big.py ({MAX_LINES + 1} lines)"]
