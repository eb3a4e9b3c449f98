"""P-01 (seed 000 lines 23-24): the runtime names no vendor, tenant, CRM object or profile.

"The protocol is generic L0 integration substrate. It cannot branch on CRM object
names, tenant-specific fields, profile literals, or vendor-specific endpoints."

Every runtime module (protocol/, activities/, services/, workflows/, db/ with its migrations,
worker/, ingress/, cli/, connector_push_client/) is scanned: its string literals and
names (Python, by AST) and its SQL (migrations, comments stripped). Docstrings and
comments are prose, not code: they may cite the vendor a rule was read against, but
nothing can branch on them. `examples/` and `sandbox/` are where the vendor-shaped demo
lives; the denylist is derived from what they declare, plus explicit vendor words, so
renaming a demo object or profile moves the test with it.

The only exceptions are the seed-004 workflow-action vocabulary (ALLOWED below).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("protocol", "activities", "services", "workflows", "db", "worker", "ingress", "cli")
RUNTIME_PACKAGES = (*RUNTIME, "connector_push_client")
EXAMPLES = ROOT / "examples"

# Vendors (and their endpoint shapes) no runtime module may name, whatever the demo uses.
VENDOR_WORDS = frozenset(
    {"hubspot", "salesforce", "zoho", "pipedrive", "marketo", "zendesk", "freshsales"}
)
VENDOR_FRAGMENTS = frozenset({"hs_", "/crm/v3/", "/automation/v4/", "x-hubspot"})

# The seed-004 workflow-action protocol (004 "Workflow actions"; SPEC ING-7, C-7) is
# defined by the vendor's wire format: the action answer's state field, the BLOCK
# expiry field, the completion callback path and the execution id field are what the
# remote sends and expects, not configuration a tenant could choose. Steering kept
# that L2 vocabulary in the runtime, so each literal is allowed in the modules that
# speak it, and nowhere else.
ALLOWED: dict[str, frozenset[str]] = {
    "hs_execution_state": frozenset({"ingress/actions.py", "services/action_callback.py"}),
    "hs_expiration_duration": frozenset({"ingress/actions.py"}),
    "/automation/v4/actions/callbacks/{callback_id}/complete": frozenset(
        {"protocol/action_callback.py"}
    ),
    "callbackId": frozenset({"protocol/ingress_policy.py"}),
    # The ordinary-webhook event shape (seed 004 "L0 Ordinary Ingress"): a route's default
    # object id path; any route names its own (`object_id_path`).
    "objectId": frozenset({"protocol/ingress_policy.py"}),
    # The ingress's own answer (a receipt id per event id it routed), not a field it reads.
    "eventId": frozenset({"ingress/webhook.py"}),
}


def _load(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text())


def _plural_forms(word: str) -> set[str]:
    """`word` lower-cased with its simple singular and plural (deal/deals, company/companies)."""
    w = word.lower()
    if w.endswith("ies"):
        return {w, w[:-3] + "y"}
    if w.endswith("y"):
        return {w, w[:-1] + "ies"}
    if w.endswith("s"):
        return {w, w[:-1]}
    return {w, w + "s"}


@dataclass(frozen=True)
class Denylist:
    words: frozenset[str]  # a token of a literal or name (case-insensitive)
    fragments: frozenset[str]  # a substring of a literal (case-insensitive)
    exact: frozenset[str]  # a whole literal (case-sensitive)


def _objects(pack: Any, sandbox: Any, records: Any, ingress: Any) -> set[str]:
    """CRM object names: the local objects, the remote object types, the routed events'."""
    names = {s["sourceObject"] for s in pack["actionSlots"]}
    names |= {d["targetObject"] for d in pack["destinationSlots"]}
    names |= set(sandbox["object_types"])
    names |= {r["object"] for r in records["records"]}
    for endpoint in ingress["endpoints"]:
        names |= {event.split(".")[0] for event in endpoint.get("routes", {})}
    return {form for name in names for form in _plural_forms(name)}


def _slot_names(pack: Any) -> set[str]:
    """Tenant configuration: owner, slots, flows, scopes, profiles, credentials, mirrors."""
    names = {pack["connectorOwnerKey"]}
    for slot in pack["actionSlots"]:
        names |= {slot["id"], slot["flowDeveloperName"], slot["flowActionName"]}
        names |= {slot["destinationSlot"], *slot["mirror"].values()}
        names |= {a["id"] for a in slot.get("associations", ())}
    for destination in pack["destinationSlots"]:
        names |= {destination["id"], destination["remoteScope"], destination["profile"]}
    for profile in pack["profiles"]:
        names |= {profile["name"], profile["credentialRef"], profile["endpointClass"]}
    for rule in pack.get("lineage", ()):
        names |= {rule["fromSlot"], rule["toSlot"]}
    return names


def _keys(document: Any) -> Iterator[str]:
    """Every mapping key of a YAML document: its schema vocabulary, not tenant data."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield str(key)
            yield from _keys(value)
    elif isinstance(document, list):
        for value in document:
            yield from _keys(value)


def _fields(pack: Any, ingress: Any) -> set[str]:
    """Tenant and vendor field names: mapped properties and the events' identity fields."""
    names = {pack["namespace"]}
    for slot in pack["actionSlots"]:
        for item in (*slot["mappings"], *slot.get("associations", ())):
            names |= {item["sourceField"], item["remoteProperty"]}
    for endpoint in ingress["endpoints"]:
        identity = endpoint["identity"]
        paths = [f["path"] for f in identity.get("fields", ())] + [identity.get("path", "")]
        paths += [endpoint.get("action_id_field", ""), identity.get("attempt_path", "")]
        names |= {part for path in paths for part in path.split(".") if part}
    # Words the example files use as keys (`name`, `path`) are the schema's, not a tenant's.
    return names - set(_keys(pack)) - set(_keys(ingress))


# Example packs whose declared remote answers (PROF-1, PROF-5) no runtime literal may be.
ANSWER_PACKS = ("demo-pack.yaml", "hubspot.yaml", "salesforce.yaml")


def _declared_answers(pack: Any) -> set[str]:
    """The body fields and values a pack declares for its remote's answers: HubSpot's
    `policyName: DAILY`, Salesforce's `errorCode: REQUEST_LIMIT_EXCEEDED` live there."""
    found: set[str] = set()
    for profile in pack["profiles"]:
        answers = list(profile.get("notAppliedAnswers", ()))
        if "dailyLimit" in profile:
            answers.append(profile["dailyLimit"]["answer"])
        for answer in answers:
            found |= {answer[k] for k in ("bodyField", "bodyValue") if k in answer}
    return found


def derive_denylist() -> Denylist:
    pack, ingress = _load("demo-pack.yaml"), _load("ingress.yaml")
    sandbox, records = _load("sandbox.yaml"), _load("demo-records.yaml")
    users = {g["user"] for g in records["grants"]}
    names = _slot_names(pack) | {e["name"] for e in ingress["endpoints"]}
    names |= {c["name"] for c in ingress["save_api"]["clients"]}
    return Denylist(
        words=VENDOR_WORDS | _objects(pack, sandbox, records, ingress) | users,
        fragments=VENDOR_FRAGMENTS | {n.lower() for n in names},
        exact=frozenset(_fields(pack, ingress))
        | {value for name in ANSWER_PACKS for value in _declared_answers(_load(name))},
    )


def _tokens(text: str) -> set[str]:
    """Lower-case words of `text`, split at non-alphanumerics, then also at camelCase humps
    (so `HubSpot` is `hubspot`, and `pushDeal` holds `deal`)."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", text) if w]
    humps = [h for w in words for h in re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", w).split()]
    return {w.lower() for w in (*words, *humps)}


def offences(text: str, deny: Denylist, *, literal: bool) -> list[str]:
    """Why `text` (a literal or, with literal=False, a name) names what the runtime may not."""
    found = sorted(_tokens(text) & deny.words)
    if literal:
        found += sorted(f for f in deny.fragments if f in text.lower())
        found += [text] if text in deny.exact else []
    return found


@dataclass(frozen=True)
class Hit:
    path: str
    line: int
    text: str
    why: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text!r} names {', '.join(self.why)}"


def _docstrings(tree: ast.AST) -> set[int]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _name(node: ast.AST) -> str | None:
    """The name `node` binds or uses, if it is a name."""
    match node:
        case ast.Name(id=name) | ast.Attribute(attr=name) | ast.arg(arg=name):
            return name
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name) | ast.ClassDef(name=name):
            return name
        case ast.keyword(arg=str(name)):
            return name
        case ast.alias(name=name, asname=asname):
            return asname or name
    return None


def _python_items(tree: ast.AST) -> Iterator[tuple[int, str, bool]]:
    """(line, text, is_literal) for every string literal but docstrings, and every name."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield line, node.value, True
        elif (name := _name(node)) is not None:
            yield line, name, False


def _sql_items(text: str) -> Iterator[tuple[int, str, bool]]:
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("--", 1)[0]
        if code.strip():
            yield number, code, True


def scan_source(path: str, text: str, deny: Denylist) -> list[Hit]:
    items: Iterable[tuple[int, str, bool]]
    items = _sql_items(text) if path.endswith(".sql") else _python_items(ast.parse(text))
    hits = []
    for line, item, literal in items:
        why = offences(item, deny, literal=literal)
        if why and path not in ALLOWED.get(item, frozenset()):
            hits.append(Hit(path, line, item, tuple(why)))
    return hits


def runtime_files() -> list[Path]:
    files = [p for d in RUNTIME_PACKAGES for p in (ROOT / d).rglob("*.py")]
    return sorted(files + list((ROOT / "db" / "migrations").glob("*.sql")))


@pytest.fixture(scope="module")
def deny() -> Denylist:
    return derive_denylist()


def test_no_runtime_module_names_a_vendor_tenant_object_or_profile(deny: Denylist) -> None:
    """P-01: the scan over every runtime module finds nothing outside ALLOWED."""
    files = runtime_files()
    assert len(files) > 100, "the runtime tree was found"
    hits = [
        hit
        for path in files
        for hit in scan_source(str(path.relative_to(ROOT)), path.read_text(), deny)
    ]
    assert not hits, "\n".join(map(str, hits))


def test_the_denylist_holds_what_the_examples_declare(deny: Denylist) -> None:
    """The derivation is not vacuous: the demo's vendor, objects, profiles, owner, fields."""
    assert {"hubspot", "contact", "contacts", "company", "companies", "deal", "deals"} <= deny.words
    assert {"account", "opportunity", "alice", "bob"} <= deny.words
    assert {"sandbox-idempotent", "sandbox-plain", "sandbox-locator"} <= deny.fragments
    assert {"demo-owner", "push-contact", "remote-deals", "sandbox-portal"} <= deny.fragments
    assert {"remote_id__c", "env:sandbox_token", "/crm/v3/"} <= deny.fragments
    assert {"email", "dealname", "Email", "portalId", "callbackId", "demo"} <= deny.exact
    assert "name" not in deny.exact  # a schema key, not a tenant field
    # PROF-5: the remotes' answers are the packs' declarations, not the runtime's.
    assert {"policyName", "DAILY", "errorCode", "REQUEST_LIMIT_EXCEEDED"} <= deny.exact
    assert "UNABLE_TO_LOCK_ROW" in deny.exact


def test_every_allowed_literal_is_still_used_where_it_is_allowed(deny: Denylist) -> None:
    """A stale ALLOWED entry would silently widen the exception: each must still be needed."""
    for literal, paths in ALLOWED.items():
        assert offences(literal, deny, literal=True), f"{literal!r} needs no exception"
        for path in paths:
            items = _python_items(ast.parse((ROOT / path).read_text()))
            assert any(text == literal for _, text, _ in items), f"{literal!r} not in {path}"


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("services/remote.py", 'VENDOR = "HubSpot"\n'),
        ("protocol/gates.py", 'def f(o: str) -> bool:\n    return o == "contacts"\n'),
        ("workflows/link.py", "def push_deal() -> None: ...\n"),
        ("db/links.py", "Q = \"SELECT 1 WHERE profile = 'sandbox-locator'\"\n"),
        ("worker/main.py", 'OWNER = f"{x}demo-owner"\n'),
        ("ingress/webhook.py", 'FIELD = "portalId"\n'),
        ("cli/stack/demo_data.py", 'USERS = "users alice and bob"\n'),
        ("protocol/remote_ids.py", 'PATH = "/crm/v3/objects/{target}"\n'),
        ("protocol/daily_quota.py", 'POLICIES = frozenset({"DAILY"})\n'),
        ("protocol/outcome.py", 'LOCKED = "UNABLE_TO_LOCK_ROW"\n'),
        ("ingress/gate.py", 'STATE = "hs_execution_state"\n'),  # allowed elsewhere only
        ("db/migrations/0999_x.sql", "CREATE TABLE contact_sync (id int); -- fine here\n"),
    ],
)
def test_the_scan_fails_on_a_vendor_literal(deny: Denylist, path: str, source: str) -> None:
    """The scan is not vacuous: each of these, added to a runtime module, is a hit."""
    assert scan_source(path, source, deny)


def test_prose_and_generic_words_are_not_hits(deny: Denylist) -> None:
    source = (
        '"""Shaped like HubSpot\'s contacts API."""\n'
        "# HubSpot counts its burst window per portal\n"
        'name = "name"\nSTATE = "crm_record"\n'
    )
    assert scan_source("protocol/x.py", source, deny) == []
