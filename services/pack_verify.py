"""`pack verify`: a profile's claims probed on a test account (SPEC §14.2, §17 G-1).

The one module besides the send steps that sends to a CRM remote, and G-1's named
exception: it sends throw-away objects to a test account the operator points it at,
never a record's request, so it has no attempt, journal or gate. Each object it
creates is deleted before it returns (also when a probe fails), and the report says
which deletions the remote refused.

Probes (each on objects of its own, so one failing claim cannot hide another):
- `responseIdPath`: a POST's answer gives an id at the path, and a GET of it answers 2xx;
- `idempotency.post`: the same POST twice under one key: both 2xx with the same id;
- `locatorRecovery`: the look-up by a just-created object's locator finds its id;
- `precondition`: a PATCH under an entity tag that a PATCH before it made stale is
  refused (412), and no entity tag at all is a claim that cannot hold;
- `notAppliedStatuses`: not tested — provoking a refusal would spend the account's real
  quota (or need the remote to refuse on purpose).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import httpx
from pydantic import BaseModel, ConfigDict, JsonValue

from db import pack_verifications as q
from db.records import Conn
from protocol.jsonpath import extract_id
from protocol.manifest import ActionSlot, AnswerMatch, PackManifest, Profile
from protocol.outcome import lookup_id_path
from protocol.pack_claims import (
    Claim,
    ClaimResult,
    Finding,
    ProfileVerification,
    declared_claims,
)
from protocol.request import locator_lookup_path, wrap_body
from protocol.snapshots import ProfileSnapshot, manifest_digest
from protocol.templates import render

REQUEST_TIMEOUT_S: Final = 10.0
STALE: Final = 412


class VerifyError(ValueError):
    """The profile cannot be probed (unknown, or no action slot sends with it)."""


class VerifyReport(BaseModel):
    """What `pack verify` found, and what it cleaned up."""

    model_config = ConfigDict(frozen=True)

    manifest_digest: str
    profile: str
    base_url: str
    target_object: str
    action_slot: str
    results: tuple[ClaimResult, ...]
    deleted: tuple[str, ...] = ()
    not_deleted: tuple[str, ...] = ()

    def verification(self) -> ProfileVerification:
        return ProfileVerification(
            manifest_digest=self.manifest_digest, profile=self.profile, results=self.results
        )


@dataclass(frozen=True)
class Target:
    """Where a profile's claims are probed: one action slot sending with it."""

    profile: Profile
    slot: ActionSlot
    target_object: str


def target_of(manifest: PackManifest, profile_name: str) -> Target:
    """The first action slot whose destination uses `profile_name`."""
    profile = manifest.profile(profile_name)
    if profile is None:
        names = ", ".join(p.name for p in manifest.profiles)
        raise VerifyError(f"no profile {profile_name!r} in the pack (it has: {names})")
    for slot in manifest.action_slots:
        dest = manifest.destination_slot(slot.destination_slot)
        if dest is not None and dest.profile == profile_name:
            return Target(profile, slot, dest.target_object)
    raise VerifyError(f"profile {profile_name!r}: no action slot sends with it; nothing to probe")


def _value(nonce: str) -> str:
    # Shaped as an address: a remote that validates one property as such accepts it, and a
    # text property takes it as it is.
    return f"cp-verify-{nonce}@example.com"


@dataclass
class Probe:
    """Requests to one test account; remembers every object it created to delete it."""

    http: httpx.AsyncClient
    target: Target
    headers: Mapping[str, str]
    created: list[str] = field(default_factory=list)

    def _url(self, path: str) -> str:
        return self.target.profile.base_url.rstrip("/") + path

    def _object_path(self, remote_id: str) -> str:
        values = {"target": self.target.target_object, "remoteId": remote_id}
        return render(self.target.slot.update_path, values)

    def properties(self, nonce: str) -> dict[str, JsonValue]:
        """Required mappings (or the first one) and the locator, with throw-away values."""
        rows = [m for m in self.target.slot.mappings if m.required] or [
            self.target.slot.mappings[0]
        ]
        found: dict[str, JsonValue] = {m.remote_property: _value(nonce) for m in rows}
        recovery = self.target.profile.locator_recovery
        if recovery is not None:
            found[recovery.remote_property] = _value(nonce)
        return found

    async def send(
        self, method: str, path: str, body: JsonValue = None, headers: Mapping[str, str] = {}
    ) -> httpx.Response:
        return await self.http.request(
            method, self._url(path), json=body, headers={**self.headers, **headers}
        )

    async def create(
        self, properties: Mapping[str, JsonValue], headers: Mapping[str, str] = {}
    ) -> tuple[httpx.Response, str | None]:
        """POST an object; (the answer, the id at responseIdPath when it is a 2xx)."""
        path = render(self.target.slot.create_path, {"target": self.target.target_object})
        answer = await self.send(
            "POST", path, wrap_body(properties, self.target.slot.body_envelope), headers
        )
        remote_id = (
            extract_id(_json(answer), self.target.slot.response_id_path)
            if answer.is_success
            else None
        )
        if remote_id is not None and remote_id not in self.created:
            self.created.append(remote_id)
        return answer, remote_id

    async def read(self, remote_id: str) -> httpx.Response:
        return await self.send("GET", self._object_path(remote_id))

    async def patch(
        self, remote_id: str, properties: Mapping[str, JsonValue], headers: Mapping[str, str]
    ) -> httpx.Response:
        body = wrap_body(properties, self.target.slot.body_envelope)
        return await self.send("PATCH", self._object_path(remote_id), body, headers)

    async def clean_up(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """DELETE every object created: (deleted ids, ids the remote did not delete)."""
        deleted: list[str] = []
        kept: list[str] = []
        for remote_id in self.created:
            try:
                answer = await self.send("DELETE", self._object_path(remote_id))
                ok = answer.is_success or answer.status_code == 404
            except httpx.HTTPError:
                ok = False
            (deleted if ok else kept).append(remote_id)
        return tuple(deleted), tuple(kept)


def _json(answer: httpx.Response) -> JsonValue:
    try:
        body: JsonValue = answer.json()
    except ValueError:
        return None
    return body


def _nonce() -> str:
    return uuid.uuid4().hex[:16]


def _result(claim: Claim, holds: bool, evidence: str) -> ClaimResult:
    return ClaimResult(
        claim=claim, finding=Finding.HOLDS if holds else Finding.DOES_NOT_HOLD, evidence=evidence
    )


async def probe_response_id(probe: Probe) -> ClaimResult:
    path = probe.target.slot.response_id_path
    answer, remote_id = await probe.create(probe.properties(_nonce()))
    if remote_id is None:
        return _result(
            Claim.RESPONSE_ID_PATH, False, f"POST answered {answer.status_code}; {path} found no id"
        )
    read = await probe.read(remote_id)
    evidence = (
        f"POST answered {answer.status_code}; {path} gave {remote_id!r}; "
        f"GET of it answered {read.status_code}"
    )
    return _result(Claim.RESPONSE_ID_PATH, read.is_success, evidence)


async def probe_idempotent_post(probe: Probe) -> ClaimResult:
    post = probe.target.profile.idempotency.post
    assert post is not None
    properties = probe.properties(_nonce())
    key = {post.header: f"cp-verify-{_nonce()}"}
    first, first_id = await probe.create(properties, key)
    second, second_id = await probe.create(properties, key)
    evidence = (
        f"the same POST twice under {post.header}: answered {first.status_code} "
        f"(id {first_id!r}) and {second.status_code} (id {second_id!r})"
    )
    holds = first_id is not None and first_id == second_id
    if not holds and first_id is not None and second_id is not None:
        evidence += ": two objects"
    return _result(Claim.IDEMPOTENT_POST, holds, evidence)


async def probe_locator(probe: Probe) -> ClaimResult:
    recovery = probe.target.profile.locator_recovery
    assert recovery is not None
    properties = probe.properties(_nonce())
    answer, remote_id = await probe.create(properties)
    if remote_id is None:
        return ClaimResult(
            claim=Claim.LOCATOR_LOOKUP,
            finding=Finding.NOT_TESTED,
            evidence=f"the object to look up was not created (POST answered {answer.status_code})",
        )
    locator = str(properties[recovery.remote_property])
    path = locator_lookup_path(recovery, probe.target.target_object, locator)
    found = await probe.send("GET", path)
    # Where the runtime reads the look-up's id: the locator's own path, else the create's.
    id_path = lookup_id_path(
        probe.target.slot.response_id_path, ProfileSnapshot.build(probe.target.profile)
    )
    found_id = extract_id(_json(found), id_path) if found.is_success else None
    evidence = (
        f"created {remote_id!r}; GET {path} answered {found.status_code}"
        f"{f' with id {found_id!r}' if found_id is not None else ''}"
    )
    return _result(Claim.LOCATOR_LOOKUP, found_id == remote_id, evidence)


async def probe_precondition(probe: Probe) -> ClaimResult:
    header = probe.target.profile.precondition
    assert header is not None
    answer, remote_id = await probe.create(probe.properties(_nonce()))
    if remote_id is None:
        return ClaimResult(
            claim=Claim.PRECONDITION,
            finding=Finding.NOT_TESTED,
            evidence=f"the object to PATCH was not created (POST answered {answer.status_code})",
        )
    etag = answer.headers.get("etag") or (await probe.read(remote_id)).headers.get("etag")
    if not etag:
        return _result(
            Claim.PRECONDITION, False, "neither the POST nor a GET answered an ETag to hold"
        )
    change = {name: f"cp-verify-{_nonce()}" for name in list(probe.properties("x"))[:1]}
    fresh = await probe.patch(remote_id, change, {header.header: etag})
    stale = await probe.patch(remote_id, change, {header.header: etag})
    evidence = (
        f"PATCH under {header.header} {etag} answered {fresh.status_code}; the same tag, "
        f"then stale, answered {stale.status_code}"
    )
    return _result(Claim.PRECONDITION, fresh.is_success and stale.status_code == STALE, evidence)


def _answer_text(answer: AnswerMatch) -> str:
    if answer.body_field is None:
        return str(answer.status)
    return f"{answer.status} with {answer.body_field} {answer.body_value}"


def not_applied_untested(profile: Profile) -> ClaimResult:
    answers = [str(s) for s in profile.not_applied_statuses]
    answers += [_answer_text(a) for a in profile.not_applied_answers]
    return ClaimResult(
        claim=Claim.NOT_APPLIED,
        finding=Finding.NOT_TESTED,
        evidence=f"not provoked: a {', '.join(answers)} answer from a real remote spends "
        "its quota (or needs it to refuse on purpose)",
    )


_PROBES: Final = {
    Claim.RESPONSE_ID_PATH: probe_response_id,
    Claim.IDEMPOTENT_POST: probe_idempotent_post,
    Claim.LOCATOR_LOOKUP: probe_locator,
    Claim.PRECONDITION: probe_precondition,
}


async def _probe_claim(probe: Probe, claim: Claim) -> ClaimResult:
    if claim is Claim.NOT_APPLIED:
        return not_applied_untested(probe.target.profile)
    try:
        return await _PROBES[claim](probe)
    except httpx.HTTPError as exc:  # fail closed: a claim not seen to hold is not trusted
        evidence = f"request failed ({type(exc).__name__}); not probed"
        return ClaimResult(claim=claim, finding=Finding.NOT_TESTED, evidence=evidence)


async def verify_profile(
    http: httpx.AsyncClient, manifest: PackManifest, profile_name: str, credential: str | None
) -> VerifyReport:
    """Probe every claim of `profile_name` on the account at its base URL, deleting every
    object created; `credential` is sent as a bearer token and never reported."""
    target = target_of(manifest, profile_name)
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    probe = Probe(http, target, headers)
    results: list[ClaimResult] = []
    try:
        for claim in declared_claims(target.profile):
            results.append(await _probe_claim(probe, claim))
    finally:
        deleted, kept = await probe.clean_up()
    return VerifyReport(
        manifest_digest=manifest_digest(manifest),
        profile=profile_name,
        base_url=target.profile.base_url,
        target_object=target.target_object,
        action_slot=target.slot.id,
        results=tuple(results),
        deleted=deleted,
        not_deleted=kept,
    )


async def store_report(conn: Conn, report: VerifyReport, operator: str) -> int:
    """Keep the findings with the pack's digest, for `pack apply` (migration 0270)."""
    results: list[JsonValue] = [r.model_dump(mode="json") for r in report.results]
    return await q.insert_verification(
        conn, report.manifest_digest, report.profile, report.base_url, results, operator
    )


async def verifications_for(conn: Conn, manifest: PackManifest) -> dict[str, ProfileVerification]:
    """The newest findings of each profile verified for this manifest's digest."""
    digest = manifest_digest(manifest)
    stored = await q.select_latest(conn, digest)
    return {
        name: ProfileVerification.model_validate(
            {"manifest_digest": digest, "profile": name, "results": results}
        )
        for name, results in stored.items()
    }
