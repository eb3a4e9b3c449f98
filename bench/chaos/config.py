"""Campaign settings from the environment: `CHAOS_SEED`, `CHAOS_SECONDS`, `CHAOS_SETTLE_SECONDS`,
`CHAOS_SIDE_PATHS` (0: the main path's actors only, as before issue 50's side paths) and
`CHAOS_FAMILY`: which remote family the campaign pushes to, each described once below —
`demo` (the default: examples/demo-pack.yaml against the sandbox's generous mode),
`hubspot` (examples/hubspot.yaml against its hubspot mode) or `salesforce`
(examples/salesforce.yaml against its salesforce mode)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE.parent / "results"
EXAMPLES = HERE.parents[1] / "examples"
RESULTS = RESULTS_DIR / "chaos-latest.json"
OBJECTS = "/crm/v3/objects"
SOBJECTS = "/services/data/v59.0/sobjects"


@dataclass(frozen=True)
class Profile:
    """One action slot of the family's pack and the record object it pushes."""

    name: str  # the pack profile, for reports
    slot: str
    destination: str
    target: str  # the destination slot's targetObject (the sandbox's object type)
    source_object: str
    prefix: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class Variants:
    """Where each `pack_apply` variant (packs.VARIANTS) changes the family's pack."""

    mapping: tuple[str, str]  # (action slot, source field): that mapping row is dropped
    credential: str  # the profile whose credentialGeneration changes
    endpoint: str  # the profile whose endpointClass changes
    slot_removed: str  # the action slot removed (the base pack recreates it)


@dataclass(frozen=True)
class Family:
    """One remote family: the pack, the sandbox it runs against, and what the campaign's
    world, fault rules and side paths aim at there."""

    name: str
    pack: Path
    sandbox: Path  # the sandbox config the campaign starts from
    owner: str  # the pack's connectorOwnerKey
    contacts: Profile
    companies: Profile
    deals: Profile | None
    # The company slot creates its primary contact's association inline (LANE-2): a
    # company's create waits for that contact's link.
    companies_wait_on_contact: bool
    # (method, path glob) the re-drawn fault rules hit: creates first (the contacts' POST
    # first of all), then PATCHes and look-ups.
    fault_targets: tuple[tuple[str, str], ...]
    # Statuses a `status_not_applied` fault answers: what the pack declares refused
    # before processing (a 429 carries Retry-After).
    not_applied_statuses: tuple[int, ...]
    variants: Variants
    # The contacts' short keyRetention (the campaign pack's and the sandbox's): None when
    # the pack declares no idempotency key, so `key_expired_resend` does not apply.
    key_retention_s: int | None = None
    credential_ref: str | None = None  # set with a token the sandbox requires; None: none
    listing_id: str = "id"  # the id's key in the sandbox's objects listing
    # Top-level settings replaced in the sandbox config for the campaign (its limits).
    sandbox_changes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def profiles(self) -> tuple[Profile, ...]:
        return tuple(p for p in (self.contacts, self.companies, self.deals) if p is not None)

    @property
    def second_contacts(self) -> Profile:
        """The campaign pack's second creator of Contact records at the contacts'
        destination (bench/chaos/packs.py): saved by the `two_slot_save` actor only."""
        return replace(self.contacts, slot=f"{self.contacts.slot}-b")

    @property
    def object_types(self) -> tuple[str, ...]:
        return tuple(p.target for p in self.profiles)

    @property
    def post_paths(self) -> tuple[str, ...]:
        return tuple(path for method, path in self.fault_targets if method == "POST")

    @property
    def not_applicable(self) -> dict[str, str]:
        """Side paths this family cannot walk, and why (reported in the JSON, not counted)."""
        if self.key_retention_s is not None:
            return {}
        why = (
            f"{self.pack.name} declares no idempotency key: a create whose answer was lost "
            "is resolved by its locator look-up, never re-sent on a key"
        )
        return {"key_expired_resend": why}


DEMO = Family(
    name="demo",
    pack=EXAMPLES / "demo-pack.yaml",
    # examples/sandbox.yaml without the contacts' unique email, and keys kept 12 s.
    sandbox=HERE / "sandbox.yaml",
    owner="demo-owner",
    contacts=Profile(
        "sandbox-idempotent",
        "push-contact",
        "remote-contacts",
        "contacts",
        "Contact",
        "c",
        ("FirstName", "LastName", "Email", "Phone"),
    ),
    companies=Profile(
        "sandbox-plain",
        "push-company",
        "remote-companies",
        "companies",
        "Account",
        "a",
        ("Name", "Website", "PrimaryContactId"),
    ),
    deals=Profile(
        "sandbox-locator",
        "push-deal",
        "remote-deals",
        "deals",
        "Opportunity",
        "o",
        ("Name", "Amount"),
    ),
    companies_wait_on_contact=True,
    fault_targets=(
        ("POST", f"{OBJECTS}/contacts"),
        ("POST", f"{OBJECTS}/companies"),
        ("POST", f"{OBJECTS}/deals"),
        ("PATCH", f"{OBJECTS}/*/*"),
        ("GET", f"{OBJECTS}/deals/*"),  # the deals' locator look-ups
    ),
    not_applied_statuses=(429,),
    variants=Variants(
        mapping=("push-deal", "Amount"),
        credential="sandbox-plain",
        endpoint="sandbox-locator",
        slot_removed="push-deal",
    ),
    key_retention_s=12,  # sandbox.yaml's contacts idempotency_key_ttl_s is the same
)

HUBSPOT = Family(
    name="hubspot",
    pack=EXAMPLES / "hubspot.yaml",
    # As published: contacts unique by email, the runtime's locator on every type, the
    # strict limiter at 100 per 10 s and 250,000 a day, which the pack declares too
    # (rateLimit), so the runtime paces to it rather than the campaign lifting it.
    sandbox=EXAMPLES / "sandbox-hubspot.yaml",
    owner="demo-owner",
    contacts=Profile(
        "hubspot-objects",
        "push-contact",
        "hubspot-contacts",
        "contacts",
        "Contact",
        "c",
        ("FirstName", "LastName", "Email", "Phone"),
    ),
    companies=Profile(
        "hubspot-objects",
        "push-company",
        "hubspot-companies",
        "companies",
        "Account",
        "a",
        ("Name", "Website"),
    ),
    deals=Profile(
        "hubspot-objects",
        "push-deal",
        "hubspot-deals",
        "deals",
        "Opportunity",
        "o",
        ("Name", "Amount"),
    ),
    companies_wait_on_contact=False,
    fault_targets=(
        ("POST", f"{OBJECTS}/contacts"),
        ("POST", f"{OBJECTS}/companies"),
        ("POST", f"{OBJECTS}/deals"),
        ("PATCH", f"{OBJECTS}/*/*"),
        ("GET", f"{OBJECTS}/*/*"),  # every type's locator look-ups
    ),
    not_applied_statuses=(429, 423),
    variants=Variants(
        mapping=("push-deal", "Amount"),
        credential="hubspot-objects",
        endpoint="hubspot-objects",
        slot_removed="push-deal",
    ),
    credential_ref="env:HUBSPOT_TOKEN",
)

SALESFORCE = Family(
    name="salesforce",
    pack=EXAMPLES / "salesforce.yaml",
    sandbox=EXAMPLES / "sandbox-salesforce.yaml",
    # The example org's 15,000 requests per rolling 24 hours would be spent by a long
    # campaign, and every request then waits a whole day (the pack's dailyLimit), which
    # no settle phase outlasts: the campaign's org has a larger allocation instead.
    sandbox_changes={"salesforce_limits": {"allocation": 1_000_000}},
    owner="crm-owner",
    contacts=Profile(
        "sf-rest",
        "sf-contact",
        "sf-contacts",
        "Contact",
        "Contact",
        "c",
        ("FirstName", "LastName", "Email", "Phone"),
    ),
    companies=Profile(
        "sf-rest", "sf-account", "sf-accounts", "Account", "Account", "a", ("Name", "Website")
    ),
    deals=None,
    companies_wait_on_contact=False,
    fault_targets=(
        ("POST", f"{SOBJECTS}/Contact/"),
        ("POST", f"{SOBJECTS}/Account/"),
        ("PATCH", f"{SOBJECTS}/*/*"),
        ("GET", f"{SOBJECTS}/*/Connector_Push_Locator__c/*"),  # the locator look-ups
    ),
    not_applied_statuses=(400,),  # 400 UNABLE_TO_LOCK_ROW
    variants=Variants(
        mapping=("sf-account", "Website"),
        credential="sf-rest",
        endpoint="sf-rest",
        slot_removed="sf-account",
    ),
    credential_ref="env:SALESFORCE_TOKEN",
    listing_id="Id",
)

FAMILIES = {f.name: f for f in (DEMO, HUBSPOT, SALESFORCE)}


def family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"CHAOS_FAMILY={name!r}: one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


@dataclass(frozen=True)
class ChaosConfig:
    """One campaign: its seed, how long faults are injected, how long settling may take."""

    seed: int = 1
    seconds: float = 600.0
    settle_seconds: float = 300.0
    workers: int = 2
    results: Path = RESULTS
    workdir: Path | None = None  # where the stack's data and logs go (default: the temp dir)
    side_paths: bool = True  # issue 50's side-path actors (pack apply, two-slot saves, ...)
    family: Family = DEMO

    @classmethod
    def from_env(cls) -> ChaosConfig:
        seconds = float(os.environ.get("CHAOS_SECONDS", "600"))
        default_settle = str(max(150.0, min(300.0, seconds / 2)))
        family = family_named(os.environ.get("CHAOS_FAMILY", DEMO.name))
        # A family's run does not overwrite the demo's latest results.
        default_results = RESULTS if family is DEMO else RESULTS_DIR / f"chaos-{family.name}.json"
        return cls(
            seed=int(os.environ.get("CHAOS_SEED", "1")),
            seconds=seconds,
            settle_seconds=float(os.environ.get("CHAOS_SETTLE_SECONDS", default_settle)),
            results=Path(os.environ.get("CHAOS_RESULTS", str(default_results))),
            workdir=Path(os.environ["CHAOS_WORKDIR"]) if "CHAOS_WORKDIR" in os.environ else None,
            side_paths=os.environ.get("CHAOS_SIDE_PATHS", "1") != "0",
            family=family,
        )

    @property
    def record_pool(self) -> int:
        """Records per profile: enough fresh creates for the whole run."""
        return int(max(60, self.seconds / 3))
