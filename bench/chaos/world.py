"""The local records the campaign pushes: one pool per profile of the family's pack
(bench/chaos/config.py), and seeded edits.

Every record's pushed body is unique (its id is in a mapped field), so a ledger
create can be traced back to the attempt that sent it by body hash alone, even
on the profile without idempotency key or locator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.chaos.config import Family, Profile
from protocol.admission import SaveRequest
from protocol.identity import link_key

USER = "chaos"
MIRROR_FIELDS = ("remote_id__c", "remote_provenance__c")


@dataclass(frozen=True)
class Record:
    profile: Profile
    record_id: str
    owner: str  # the pack's connectorOwnerKey

    @property
    def link_key(self) -> str:
        p = self.profile
        return link_key(self.owner, p.slot, p.source_object, self.record_id, p.destination)

    def save_request(self) -> SaveRequest:
        p = self.profile
        return SaveRequest(
            connector_owner_key=self.owner,
            action_slot_id=p.slot,
            destination_slot_id=p.destination,
            source_object=p.source_object,
            source_record_id=self.record_id,
            originating_user_id=USER,
        )

    def cli_args(self) -> list[str]:
        p = self.profile
        return [
            "--owner-key",
            self.owner,
            "--action-slot",
            p.slot,
            "--destination-slot",
            p.destination,
            "--source-object",
            p.source_object,
            "--record-id",
            self.record_id,
            "--user",
            USER,
        ]


class World:
    """The record pools and their seeded field values (edits bump a per-record revision)."""

    def __init__(self, seed: int, size: int, family: Family) -> None:
        self.family = family
        self._rng = random.Random(f"world:{seed}")
        self._tag = f"s{seed}"
        self.records = {
            p: [Record(p, f"{p.prefix}-{i:04d}", family.owner) for i in range(size)]
            for p in family.profiles
        }
        self._revision: dict[Record, int] = {}
        contacts = self.records[family.contacts]
        # Each company's primary contact, fixed at the start (the association is frozen).
        self._contact = {
            r: self._rng.choice(contacts).record_id for r in self.records[family.companies]
        }
        self._dependencies = (
            {
                r.link_key: Record(family.contacts, contact, family.owner).link_key
                for r, contact in self._contact.items()
            }
            if family.companies_wait_on_contact
            else {}
        )

    def fields(self, record: Record) -> dict[str, object]:
        """The record's current field values (a function of its id and revision)."""
        n, rev = record.record_id, self._revision.get(record, 0)
        if record.profile.source_object == self.family.contacts.source_object:
            return {
                "FirstName": f"First{rev}",
                "LastName": f"Chaos {n}",
                "Email": f"{self._tag}-{n}@chaos.example",
                "Phone": f"+1 555 {rev:04d}",
            }
        if record.profile is self.family.companies:
            company: dict[str, object] = {
                "Name": f"Chaos Account {n}",
                "Website": f"{n}-r{rev}.example.com",
            }
            if self.family.companies_wait_on_contact:
                company["PrimaryContactId"] = self._contact[record]
            return company
        return {"Name": f"Chaos Deal {n}", "Amount": 1000 + rev}

    def pick(self, rng: random.Random) -> Record:
        return rng.choice(self.records[rng.choice(self.family.profiles)])

    def edit(self, record: Record) -> dict[str, object]:
        """A records document changing one record's non-key fields (mirror fields kept)."""
        self._revision[record] = self._revision.get(record, 0) + 1
        fields = self.fields(record)
        # The association is frozen at the first save.
        fields.pop("PrimaryContactId", None)
        return {"records": [self._spec(record, fields)]}

    def initial_document(self) -> dict[str, object]:
        """Every record, and a grant for the campaign's user on every field it pushes."""
        records = [self._spec(r, self.fields(r)) for pool in self.records.values() for r in pool]
        grants = [
            {
                "user": USER,
                "object": p.source_object,
                "records": "*",
                "fields": [*p.fields, *MIRROR_FIELDS],
            }
            for p in self.family.profiles
        ]
        return {"records": records, "grants": grants}

    @staticmethod
    def _spec(record: Record, fields: dict[str, object]) -> dict[str, object]:
        return {"object": record.profile.source_object, "id": record.record_id, "fields": fields}

    def record(self, link_key: str) -> Record:
        return next(r for pool in self.records.values() for r in pool if r.link_key == link_key)

    def second_slot(self, record: Record) -> Record:
        """The same Contact record under the second contact slot."""
        return Record(self.family.second_contacts, record.record_id, record.owner)

    def dependency(self, link_key: str) -> str | None:
        """The link key a company's create waits on (its primary contact's), if any."""
        return self._dependencies.get(link_key)
