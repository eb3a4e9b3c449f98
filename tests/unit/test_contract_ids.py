"""The contract lives in the repository (STYLE rule 23): every requirement id the code or
a test cites is defined in docs/contract.md, and product code gives reasons, not issue
numbers a reader with the repository alone cannot follow.

A definition is a paragraph that starts with the id in bold: `**ID-5** At most one …`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "contract.md"
PRODUCT = (
    "protocol",
    "workflows",
    "activities",
    "services",
    "db",
    "worker",
    "ingress",
    "cli",
    "sandbox",
    "client/connector_push_client",
)
SUFFIXES = frozenset({".py", ".sql"})
MIGRATIONS = ROOT / "db" / "migrations"

# An id: two to five capitals, a dash, a number, an optional letter and prime
# (`WF-1'`). Product code may also cite the one-letter families (C-, G-, S-); tests use
# other one-letter tokens as data (`L-1`, a locator value), so there only C, G and S count.
PRODUCT_ID = re.compile(r"(?<![A-Za-z0-9_-])([A-Z]{1,5}-[0-9]+[A-Z]?)('?)")
TEST_ID = re.compile(r"(?<![A-Za-z0-9_-])([A-Z]{2,5}-[0-9]+[A-Z]?|[CGS]-[0-9]+)('?)")
DEFINITION = re.compile(r"^\*\*([A-Z]{1,5}-[0-9]+[A-Z]?'?)\*\* ", re.MULTILINE)
# Standard names that look like ids, and change tickets tests pass as approval data.
STANDARD = frozenset({"UTF-8", "SHA-256", "ISO-8601", "UTC-5"})
NOT_IDS = re.compile(r"RFC-[0-9]+|CHG-[0-9]+")

ISSUE_REFERENCE = re.compile(r"\bissues? #?[0-9]+", re.IGNORECASE)


def _files(roots: Iterable[str]) -> Iterator[Path]:
    for name in roots:
        for path in sorted((ROOT / name).rglob("*")):
            if path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                yield path
    yield ROOT / "Makefile"


def _ids(text: str, pattern: re.Pattern[str]) -> Iterator[str]:
    """Each id cited in `text`; `ID-2's` cites ID-2 and `'G-3'` (a quoted string) G-3."""
    for match in pattern.finditer(text):
        ident, prime = match.groups()
        after = text[match.end() : match.end() + 1]
        quoted = text[match.start() - 1 : match.start()] == "'"
        if prime and not after.isalpha() and not quoted:
            ident += prime
        if ident not in STANDARD and not NOT_IDS.fullmatch(ident):
            yield ident


def _cited(paths: Iterable[Path], pattern: re.Pattern[str]) -> dict[str, str]:
    """id -> the first file citing it."""
    cited: dict[str, str] = {}
    for path in paths:
        for ident in _ids(path.read_text(encoding="utf-8"), pattern):
            cited.setdefault(ident, str(path.relative_to(ROOT)))
    return cited


def _defined() -> Counter[str]:
    return Counter(DEFINITION.findall(CONTRACT.read_text(encoding="utf-8")))


def test_every_id_product_code_cites_is_defined_in_the_contract() -> None:
    defined = _defined()
    missing = {i: f for i, f in _cited(_files(PRODUCT), PRODUCT_ID).items() if i not in defined}
    assert not missing, f"cited but not defined in docs/contract.md: {missing}"


def test_every_id_a_test_cites_is_defined_in_the_contract() -> None:
    tests = sorted(p for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts)
    defined = _defined()
    missing = {i: f for i, f in _cited(tests, TEST_ID).items() if i not in defined}
    assert not missing, f"cited but not defined in docs/contract.md: {missing}"


def test_each_id_is_defined_once() -> None:
    twice = sorted(ident for ident, count in _defined().items() if count > 1)
    assert not twice, f"defined more than once in docs/contract.md: {twice}"


def test_the_id_reader_keeps_primes_and_drops_possessives_and_quotes() -> None:
    text = "WF-1' ends a run; ID-2's rule; 'G-3' in SQL; UTF-8 and CHG-7 are no ids; L-1"
    assert list(_ids(text, PRODUCT_ID)) == ["WF-1'", "ID-2", "G-3", "L-1"]
    assert list(_ids(text, TEST_ID)) == ["WF-1'", "ID-2", "G-3"]


def test_product_code_gives_reasons_not_issue_numbers() -> None:
    # Applied migrations never change (STO-5), so their old comments may keep theirs.
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _files(PRODUCT)
        if MIGRATIONS not in path.parents
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert not found, "say the reason instead of the issue:\n" + "\n".join(found)
