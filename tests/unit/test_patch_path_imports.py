"""V-6 (seed 000 lines 542-547, SPEC §9 REV-3): PATCH never reads the receipt table.

"History lives only in `_System_ConnectorPushLinkRevalidationReceipt`; PATCH never
reads that table." The PATCH path is its steps and activity (services/patch/,
activities/link_ops.py), its gates (protocol/gates.py) and its queries
(db/patches.py), with every module of ours they import, at any depth and from any
scope (a function-level import counts). None of those modules may name the receipt
table or import the revalidation modules that read it. The schema half of the
acceptance row (no `effective_*` columns, V-18) is in tests/db/test_receipt_rows.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = frozenset(
    {
        "protocol",
        "activities",
        "services",
        "workflows",
        "db",
        "worker",
        "ingress",
        "cli",
        "connector_push_client",
    }
)
PATCH_PATH = (
    "services.patch.dispatch",
    "services.patch.plan",
    "services.patch.claim",
    "services.patch.send",
    "services.patch.answer",
    "services.patch.apply",
    "activities.link_ops",
    "protocol.gates",
    "db.patches",
)
RECEIPT_TABLE = "connector_link_revalidation_receipt"
# The modules that read or write receipts (bulk revalidation, SPEC §9). The pure
# protocol.revalidation (receipt models, digests) does no I/O, so it cannot read one.
RECEIPT_READERS = frozenset(
    {
        "db.revalidation",
        "services.revalidation",
        "services.revalidation_plan",
        "services.revalidation_owner",
        "cli.revalidate_cmd",
        "cli.revalidate_owner_cmd",
    }
)


def source_of(module: str) -> Path | None:
    for path in (
        ROOT / f"{module.replace('.', '/')}.py",
        ROOT / module.replace(".", "/") / "__init__.py",
    ):
        if path.exists():
            return path
    return None


def _imported(module: str, path: Path) -> Iterator[str]:
    """Every module name `module` imports anywhere in its body (a name imported from a
    package may be a module: `from db import patches`)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def closure(roots: Iterable[str]) -> dict[str, str | None]:
    """`roots` and every module of ours they import, transitively, each with the module
    it was first found imported by (None for a root)."""
    seen: dict[str, str | None] = {}
    todo: list[tuple[str, str | None]] = [(root, None) for root in roots]
    while todo:
        module, importer = todo.pop(0)
        path = source_of(module)
        if module in seen or module.split(".")[0] not in OURS or path is None:
            continue
        seen[module] = importer
        todo.extend((imported, module) for imported in _imported(module, path))
    return seen


def chain(modules: dict[str, str | None], module: str) -> str:
    """How an entry point reaches `module`: `a -> b -> module`."""
    links = [module]
    while (importer := modules[links[-1]]) is not None:
        links.append(importer)
    return " -> ".join(reversed(links))


def _code_strings(path: Path) -> Iterator[str]:
    """Every string literal of a module but its docstrings (prose may name the table)."""
    tree = ast.parse(path.read_text())
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners) and node.body and isinstance(node.body[0], ast.Expr)
    }
    for node in ast.walk(tree):
        match node:
            case ast.Constant(value=str(text)) if id(node) not in docstrings:
                yield text


def naming_the_receipts(modules: Iterable[str]) -> list[str]:
    """The modules whose code (SQL included) names the receipt table."""
    found = []
    for module in sorted(modules):
        path = source_of(module)
        assert path is not None
        if any(RECEIPT_TABLE in text.lower() for text in _code_strings(path)):
            found.append(module)
    return found


def test_the_patch_path_is_what_its_entry_points_import() -> None:
    modules = closure(PATCH_PATH)
    assert set(PATCH_PATH) | {"db.links", "db.journal", "protocol.drift"} <= modules.keys()
    assert chain(modules, "db.patches") == "db.patches"


def test_the_patch_path_never_reads_the_revalidation_receipts() -> None:
    """V-6: no module on the PATCH path names the receipt table or imports a reader of it."""
    modules = closure(PATCH_PATH)
    readers = [chain(modules, m) for m in sorted(modules.keys() & RECEIPT_READERS)]
    assert readers == [], "the PATCH path imports a receipt reader"
    naming = [chain(modules, m) for m in naming_the_receipts(modules)]
    assert naming == [], "the PATCH path names the receipt table"


def test_the_check_sees_the_receipt_readers() -> None:
    """The check can fail: revalidation's own closure is caught by both halves."""
    modules = closure(["services.revalidation"])
    assert {"services.revalidation", "db.revalidation"} <= modules.keys() & RECEIPT_READERS
    assert naming_the_receipts(modules) == ["db.revalidation"]


def test_a_function_level_or_relative_import_is_followed(tmp_path: Path) -> None:
    """An import hidden in a function body still joins the path."""
    module = tmp_path / "m.py"
    module.write_text(
        "def f() -> None:\n    from db import revalidation\n\nfrom . import sibling\n"
    )
    assert {"db", "db.revalidation"} <= set(_imported("db.m", module))
    assert {"db", "db.sibling"} <= set(_imported("db.m", module))
