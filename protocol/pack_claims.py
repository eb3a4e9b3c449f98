"""A profile's claims about its remote, as `pack verify` found them (SPEC §14.2, §17 G-1).

Rules kept in this module:
1. A claim is something the runtime acts on without asking the remote: a re-sent create
   under an idempotency key (`idempotency.post`), a PATCH refused when stale
   (`precondition`), a direct look-up by locator (`locatorRecovery`), an answer that
   applied nothing (`notAppliedStatuses`, by status alone or by `notAppliedAnswers`),
   the id found at `responseIdPath`.
2. Each is reported `holds`, `does_not_hold` or `not_tested`, with the evidence.
3. `pack apply` refuses a profile whose replay-safety or precondition claim was found not
   holding for the pack's digest; in a production deployment, also one never verified
   (or only `not_tested`). An operator may override, explicitly and audited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict

from protocol.manifest import PackManifest, Profile


class Claim(StrEnum):
    IDEMPOTENT_POST = "idempotency.post"
    PRECONDITION = "precondition"
    LOCATOR_LOOKUP = "locatorRecovery"
    NOT_APPLIED = "notAppliedStatuses"
    RESPONSE_ID_PATH = "responseIdPath"


class Finding(StrEnum):
    HOLDS = "holds"
    DOES_NOT_HOLD = "does_not_hold"
    NOT_TESTED = "not_tested"


# The claims whose failure turns a lost answer into a second object, or a stale PATCH
# into an overwrite: apply refuses on them (the others fail closed at run time).
GUARDED: Final = (Claim.IDEMPOTENT_POST, Claim.PRECONDITION)


class ClaimResult(BaseModel):
    """One claim of one profile, as probed, and what was seen."""

    model_config = ConfigDict(frozen=True)

    claim: Claim
    finding: Finding
    evidence: str


class ProfileVerification(BaseModel):
    """What `pack verify` found for one profile of the pack with `manifest_digest`."""

    model_config = ConfigDict(frozen=True)

    manifest_digest: str
    profile: str
    results: tuple[ClaimResult, ...]

    def finding(self, claim: Claim) -> Finding | None:
        return next((r.finding for r in self.results if r.claim is claim), None)


def declared_claims(profile: Profile) -> tuple[Claim, ...]:
    """The claims a profile makes (the response id path is every action slot's)."""
    claims: list[Claim] = []
    if profile.idempotency.post is not None:
        claims.append(Claim.IDEMPOTENT_POST)
    if profile.precondition is not None:
        claims.append(Claim.PRECONDITION)
    if profile.locator_recovery is not None:
        claims.append(Claim.LOCATOR_LOOKUP)
    if profile.not_applied_statuses or profile.not_applied_answers:
        claims.append(Claim.NOT_APPLIED)
    claims.append(Claim.RESPONSE_ID_PATH)
    return tuple(claims)


def guarded_claims(profile: Profile) -> tuple[Claim, ...]:
    return tuple(c for c in declared_claims(profile) if c in GUARDED)


def _problem(
    index: int, profile: Profile, claim: Claim, found: ProfileVerification | None, production: bool
) -> str | None:
    finding = found.finding(claim) if found is not None else None
    where = f"profiles[{index}] {profile.name!r}: {claim.value}"
    if finding is Finding.DOES_NOT_HOLD:
        return f"{where} was found not holding by `pack verify` for this pack's digest"
    if production and finding is not Finding.HOLDS:
        state = "never verified" if finding is None else "not tested"
        return f"{where} is {state} for this pack's digest (a production deployment)"
    return None


def unverified_claim_problems(
    manifest: PackManifest,
    verifications: Mapping[str, ProfileVerification],
    *,
    production: bool,
) -> Iterator[str]:
    """The guarded claims `pack apply` refuses: found not holding, or (in production)
    not found holding. `verifications` are by profile name, for this manifest's digest."""
    for index, profile in enumerate(manifest.profiles):
        for claim in guarded_claims(profile):
            problem = _problem(index, profile, claim, verifications.get(profile.name), production)
            if problem is not None:
                yield problem
